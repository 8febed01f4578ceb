//! The one retry layer (to be written).
