//! The reference engine (to be written).
