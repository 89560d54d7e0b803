//! State administration.
