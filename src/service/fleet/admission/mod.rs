//! Admission: what a request may hold before the fleet looks anything up or writes anything.
//! Each field's bounds (`limits`), the store directory's root (`paths`), the destination's
//! shape and place (`destination`), and the new store against every registered one
//! (`conflicts`, over an index of their paths, `path_index`). Nothing here knows the hosted
//! stores or touches the registry: a refused request leaves everything as it was.

pub mod conflicts;
pub mod destination;
pub mod limits;
pub mod path_index;
pub mod paths;
