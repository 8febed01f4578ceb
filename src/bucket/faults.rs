//! Fault injection (to be written).
