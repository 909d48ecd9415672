//! The embedded kernels: the fatbin that build.rs compiles from `kernels/`, loaded once per
//! context on first use, and lookup of kernel functions by name.
