//! Groups: `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`.

use super::{entry, export};
use crate::abi::{ncclResult_t, ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};
use crate::error::Error;

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    export!(ncclGroupStart, name);
    entry(name, std::ptr::null_mut(), || {
        crate::core::group::start();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    export!(ncclGroupEnd, name);
    entry(name, std::ptr::null_mut(), crate::core::group::end)
}

#[no_mangle]
pub extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    export!(ncclGroupSimulateEnd, name);
    entry(name, std::ptr::null_mut(), || {
        // NVIDIA's order: not being in a group is checked first, and a NULL simInfo makes
        // this a plain ncclGroupEnd.
        if crate::core::group::depth() == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupSimulateEnd: not in a group call",
            ));
        }
        if simInfo.is_null() {
            return crate::core::group::end();
        }
        // SAFETY: checked non-NULL; every version of the struct starts with size, magic.
        let magic = unsafe { std::ptr::addr_of!((*simInfo).magic).read_unaligned() };
        if magic != NCCL_SIM_INFO_MAGIC {
            return Err(Error::invalid_argument(format!(
                "simInfo magic {magic:#x} is wrong: initialise it with NCCL_SIM_INFO_INITIALIZER"
            )));
        }
        let estimate = crate::core::group::simulate_end()?;
        // SAFETY: an initialised sim info of any version has estimatedTime after the header.
        unsafe { std::ptr::addr_of_mut!((*simInfo).estimatedTime).write_unaligned(estimate) };
        Ok(())
    })
}
