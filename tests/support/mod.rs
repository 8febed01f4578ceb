//! Test support shared by the integration tests: `mod support;` in a test file.
//!
//! Each test binary uses only part of it.
#![allow(dead_code)]

pub mod s3;
