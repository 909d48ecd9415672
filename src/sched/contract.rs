//! TEMPORARY stand-in for the scheduler/kernel contract until the kernel branch lands.
#![allow(dead_code)]
use super::Task;
use crate::error::{Error, Result};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OxConn {
    pub buf: u64,
    pub tail: u64,
    pub head: u64,
    pub step: u64,
    pub slot_bytes: u32,
    pub nslots: u32,
}
pub struct Geometry {
    pub rank: i32,
    pub nranks: i32,
    pub nchannels: u32,
    pub send: Vec<Vec<Option<OxConn>>>,
    pub recv: Vec<Vec<Option<OxConn>>>,
    pub abort_flag: u64,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    Send,
    Recv,
}
pub fn connections_needed(
    _rank: i32,
    _nranks: i32,
    _nchannels: u32,
    _tasks: &[Task],
) -> Vec<(u32, i32, Dir)> {
    Vec::new()
}
pub fn plan(_geom: &Geometry, _tasks: &[Task]) -> Result<Plan> {
    Err(Error::unsupported("collectives"))
}
pub struct Plan {
    pub kernel: &'static str,
    pub grid: u32,
    pub block: u32,
    pub smem: u32,
    pub items: Vec<u8>,
    pub nitems: u32,
}
pub const SLOT_BYTES: u32 = 512 * 1024;
pub const NSLOTS: u32 = 8;
pub const NCHANNELS: u32 = 16;
pub fn estimate_us(_tasks: &[(i32, Task)]) -> f32 {
    0.0
}
