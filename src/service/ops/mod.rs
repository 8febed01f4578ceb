//! Operations on hosted stores: pause, drills, usage, events and health views.

pub mod drill;
pub(in crate::service) mod health_report;
pub(in crate::service) mod health_view;
pub mod limits;
pub mod pause;
pub(in crate::service) mod rto_view;
pub mod usage;
