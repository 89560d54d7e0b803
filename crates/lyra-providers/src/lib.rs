//! lyra-providers
