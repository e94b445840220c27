//! weir-protocol's integration tests, one binary (modules per concern). Golden vectors
//! and the Python scripts that read and write them stay in `tests/golden/`.

mod fuzz;
mod packet_decode;
mod python_golden;
mod schemas;
mod support;
