//! lyra-state
