pub mod proto;
