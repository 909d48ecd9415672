//! Groups: `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`.

use super::entry;
use crate::abi::{ncclResult_t, ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};
use crate::error::Error;

fn group_start() -> ncclResult_t {
    entry("ncclGroupStart", std::ptr::null_mut(), || {
        crate::core::group::start();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    group_start()
}
#[no_mangle]
pub extern "C" fn pncclGroupStart() -> ncclResult_t {
    group_start()
}

fn group_end() -> ncclResult_t {
    entry(
        "ncclGroupEnd",
        std::ptr::null_mut(),
        crate::core::group::end,
    )
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    group_end()
}
#[no_mangle]
pub extern "C" fn pncclGroupEnd() -> ncclResult_t {
    group_end()
}

fn group_simulate_end(info: *mut ncclSimInfo_t) -> ncclResult_t {
    entry("ncclGroupSimulateEnd", std::ptr::null_mut(), || {
        // NVIDIA's order: not being in a group is checked first, and a NULL simInfo makes
        // this a plain ncclGroupEnd.
        if crate::core::group::depth() == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupSimulateEnd: not in a group call",
            ));
        }
        if info.is_null() {
            return crate::core::group::end();
        }
        // SAFETY: checked non-NULL; every version of the struct starts with size, magic.
        let magic = unsafe { std::ptr::addr_of!((*info).magic).read_unaligned() };
        if magic != NCCL_SIM_INFO_MAGIC {
            return Err(Error::invalid_argument(format!(
                "simInfo magic {magic:#x} is wrong: initialise it with NCCL_SIM_INFO_INITIALIZER"
            )));
        }
        let estimate = crate::core::group::simulate_end()?;
        // SAFETY: an initialised sim info of any version has estimatedTime after the header.
        unsafe { std::ptr::addr_of_mut!((*info).estimatedTime).write_unaligned(estimate) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    group_simulate_end(simInfo)
}
#[no_mangle]
pub extern "C" fn pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    group_simulate_end(simInfo)
}
