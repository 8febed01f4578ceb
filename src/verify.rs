//! Verifying restore points (being written).
