//! The settings NVIDIA's NCCL 2.32.3 reads that oxccl does not build (taken from the names in
//! its library), so that one a user sets is said to be ignored instead of passing unnoticed:
//! at the first communicator's creation, each one set is reported once under
//! `NCCL_DEBUG_SUBSYS=ENV`, as NVIDIA reports the settings it reads.

/// NVIDIA's setting names that no [`super::registry`] entry reads, sorted.
pub static NOT_BUILT: &[&str] = &[
    "NCCL_ALLGATHERV_ENABLE",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS",
    "NCCL_CE_CHUNK_SIZE",
    "NCCL_CE_COLL_AG_MULTICAST_THRESHOLD",
    "NCCL_CE_INTRA_GPU_MEMCPY_ENABLE",
    "NCCL_CFT_ENABLE",
    "NCCL_CHUNK_SIZE",
    "NCCL_COLLNET_ENABLE",
    "NCCL_COLLNET_NODE_THRESHOLD",
    "NCCL_CONNECT_ROUND_MAX_PEERS",
    "NCCL_CROSS_NIC",
    "NCCL_CTA_POLICY",
    "NCCL_CUMEM_ENABLE",
    "NCCL_CUMEM_HOST_ENABLE",
    "NCCL_DEBUG_LEVELS",
    "NCCL_DEV_API_JIT",
    "NCCL_DIAGNOSTICS_ECC_THRESHOLD",
    "NCCL_DIAGNOSTICS_IB_BW_TIMEOUT",
    "NCCL_DISABLE_MEM_MANAGER",
    "NCCL_ELASTIC_BUFFER_REGISTER",
    "NCCL_ENABLE_VERSION_CHECK",
    "NCCL_ENQUEUE_REARCH_ENABLE",
    "NCCL_ENV_PLUGIN",
    "NCCL_GDAKI_FORCE_MCST",
    "NCCL_GDAKI_USE_RELIABLE_DB",
    "NCCL_GDRCOPY_ENABLE",
    "NCCL_GDRCOPY_FIFO_ENABLE",
    "NCCL_GDRCOPY_FLUSH_ENABLE",
    "NCCL_GDRCOPY_SYNC_ENABLE",
    "NCCL_GDRCOPY_USE_INTERNAL_DMABUF",
    "NCCL_GIN_ENABLE",
    "NCCL_GIN_ERROR_QUERY_SEC",
    "NCCL_GIN_GDAKI_LAG_AWARE_DISABLE",
    "NCCL_GIN_GDAKI_MAX_DEST_RD_ATOMIC",
    "NCCL_GIN_GDAKI_MAX_QP_RD_ATOMIC",
    "NCCL_GIN_GDAKI_NIC_HANDLER",
    "NCCL_GIN_GDAKI_QP_DEPTH",
    "NCCL_GIN_IB_OOO_OPT",
    "NCCL_GIN_IB_TC",
    "NCCL_GIN_NCONNECTIONS",
    "NCCL_GIN_PLUGIN",
    "NCCL_GIN_PLUGIN_REF_COUNT",
    "NCCL_GIN_PROXY_NTHREADS",
    "NCCL_GIN_PROXY_POLL_BATCH",
    "NCCL_GIN_PROXY_QUEUE_SIZE",
    "NCCL_GIN_TYPE",
    "NCCL_GRAPH_DUMP_FILE",
    "NCCL_GRAPH_DUMP_FILE_RANK",
    "NCCL_GRAPH_FILE",
    "NCCL_GRAPH_HELPER_DISABLE",
    "NCCL_GRAPH_MIXING_SUPPORT",
    "NCCL_GRAPH_REGISTER",
    "NCCL_GRAPH_STREAM_ORDERING",
    "NCCL_GROUP_CUDA_STREAM",
    "NCCL_HIER_CE_COLL_AG_RAIL_RING_ENABLE",
    "NCCL_HIER_CE_COLL_NUM_CTX",
    "NCCL_IB_DATA_DIRECT",
    "NCCL_IB_EVENT_BASED_LB",
    "NCCL_IB_EVENT_BASED_LB_REMOTE",
    "NCCL_IB_MERGE_VFS",
    "NCCL_IB_OOO_RQ",
    "NCCL_IB_PKEY_VALUE",
    "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS",
    "NCCL_IB_QUERY_PORT_SPEED",
    "NCCL_IB_RAIL_POLICY",
    "NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME",
    "NCCL_IB_RESILIENCY_PORT_FAILOVER",
    "NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS",
    "NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_INTERVAL",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_SIZE",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_SEQUENCE_SIZE",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_TIMEOUT",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX",
    "NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY",
    "NCCL_IB_SORT_MERGE_NICS",
    "NCCL_IB_SUBNET_AWARE_ROUTING",
    "NCCL_IB_SUBNET_PREFIX_LEN",
    "NCCL_IB_WARN_RAIL_LOCAL",
    "NCCL_IB_WQE_LATENCY_REPORT",
    "NCCL_IB_WQE_LATENCY_THRESHOLD_NS",
    "NCCL_IGNORE_COLLNET_MISMATCH",
    "NCCL_IGNORE_DISABLED_P2P",
    "NCCL_IGNORE_NET_MISMATCH",
    "NCCL_L1_SHARED_MEMORY_CARVEOUT",
    "NCCL_LAUNCH_MODE",
    "NCCL_LAUNCH_ORDER_IMPLICIT",
    "NCCL_LAUNCH_RACE_FATAL",
    "NCCL_LEGACY_CUDA_REGISTER",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_LL128_C2C",
    "NCCL_LL128_NTHREADS",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LOCAL_REGISTER",
    "NCCL_LSA_TEAM_SIZE",
    "NCCL_MEM_SYNC_DOMAIN",
    "NCCL_MNNVL_CLIQUE_ID",
    "NCCL_MNNVL_CROSS_CLIQUE",
    "NCCL_MNNVL_ENABLE",
    "NCCL_MNNVL_RAIL_PER_HOST",
    "NCCL_MNNVL_SCATTER_NETS_ENABLE",
    "NCCL_MNNVL_UUID",
    "NCCL_MULTI_SEGMENT_REGISTER",
    "NCCL_NCHANNELS_PER_NET_PEER",
    "NCCL_NET_DISABLE_INTRA",
    "NCCL_NET_FORCE_FLUSH",
    "NCCL_NET_FORCE_MERGE",
    "NCCL_NET_GDR_C2C",
    "NCCL_NET_MERGE_LEVEL",
    "NCCL_NET_MERGE_POLICY",
    "NCCL_NET_OPTIONAL_RECV_COMPLETION",
    "NCCL_NET_OVERHEAD",
    "NCCL_NET_PLUGIN_REF_COUNT",
    "NCCL_NET_SHARED_BUFFERS",
    "NCCL_NET_SHARED_COMMS",
    "NCCL_NO_CACHE",
    "NCCL_NUM_RMA_CTX",
    "NCCL_NUM_RMA_INT_CTX",
    "NCCL_NVB_DISABLE",
    "NCCL_NVB_PRECONNECT",
    "NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE",
    "NCCL_NVLSTREE_MAX_CHUNKSIZE",
    "NCCL_NVLS_CHUNKSIZE",
    "NCCL_NVLS_ENABLE",
    "NCCL_NVLS_NCHANNELS",
    "NCCL_NVLS_UB_SIZE",
    "NCCL_NVTX_DISABLE",
    "NCCL_OOB_NET_ENABLE",
    "NCCL_OOB_NET_IFNAME",
    "NCCL_P2P_DIRECT_DISABLE",
    "NCCL_P2P_EPOCH_ENABLE",
    "NCCL_P2P_LL_THRESHOLD",
    "NCCL_P2P_MAX_PEERS",
    "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_P2P_PCI_CHUNKSIZE",
    "NCCL_P2P_PER_CHANNEL_NET_BW",
    "NCCL_P2P_PER_CHANNEL_REG_NET_BW",
    "NCCL_P2P_PXN_LEVEL",
    "NCCL_P2P_READ_ENABLE",
    "NCCL_P2P_SCHEDULE_GROUP_SIZE",
    "NCCL_P2P_USE_CUDA_MEMCPY",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_PROGRESS_APPENDOP_FREQ",
    "NCCL_PROGRESS_COUNTERS",
    "NCCL_PROGRESS_COUNTER_MONITOR_POLL_MS",
    "NCCL_PROGRESS_COUNTER_MONITOR_STALE_MS",
    "NCCL_PROGRESS_COUNTER_MONITOR_STALE_WARN_SEC",
    "NCCL_PROXY_APPEND_BATCH_SIZE",
    "NCCL_PROXY_CPUSET",
    "NCCL_PROXY_DUMP_SIGNAL",
    "NCCL_PXN_C2C",
    "NCCL_PXN_DISABLE",
    "NCCL_RAS_TIMEOUT_FACTOR",
    "NCCL_REPORT_CONNECT_PROGRESS",
    "NCCL_RMA_DISABLE",
    "NCCL_RMA_EAGER_INIT",
    "NCCL_RMA_IB_WR_BATCHSIZE",
    "NCCL_RMA_MULTI_CTX_THRESHOLD",
    "NCCL_RMA_PLUGIN",
    "NCCL_RMA_PLUGIN_REF_COUNT",
    "NCCL_RMA_PROXY_DUMP_SIGNAL",
    "NCCL_RMA_PROXY_QUEUE_SIZE",
    "NCCL_RUN_DIAGNOSTICS",
    "NCCL_RUN_RAS_DIAGNOSTICS",
    "NCCL_SET_CPU_STACK_SIZE",
    "NCCL_SET_STACK_SIZE",
    "NCCL_SET_THREAD_NAME",
    "NCCL_SHADOW_MEMPOOL_MAX_SIZE",
    "NCCL_SHM_LOCALITY",
    "NCCL_SINGLE_PROC_MEM_REG_ENABLE",
    "NCCL_SOCKET_INLINE",
    "NCCL_SOCKET_MIN_TASKSIZE",
    "NCCL_SOCKET_POLL_TIMEOUT_MSEC",
    "NCCL_SOCKET_RETRY_CNT",
    "NCCL_SOCKET_RETRY_SLEEP_MSEC",
    "NCCL_SYM_CE_THRESHOLD",
    "NCCL_SYM_GIN_KERNELS_ENABLE",
    "NCCL_SYM_KERNEL",
    "NCCL_SYM_REUSE_SYSMEM_HANDLES",
    "NCCL_SYM_RS_GIN_CHUNK_SIZE",
    "NCCL_SYM_TMA_ENABLE",
    "NCCL_THREAD_THRESHOLDS",
    "NCCL_TOPO_SPLIT_MLOPART",
    "NCCL_UID_STAGGER_RATE",
    "NCCL_UID_STAGGER_THRESHOLD",
    "NCCL_UNPACK_DOUBLE_NCHANNELS",
    "NCCL_WIN_ENABLE",
    "NCCL_WIN_STRIDE",
    "NCCL_WORK_ARGS_BYTES",
    "NCCL_WORK_FIFO_BYTES",
];

/// Values of not-built settings that ask for what oxccl does anyway (the feature off): set so,
/// they are not reported. Compared as numbers where both are numbers.
pub static AGREEING: &[(&str, &str)] = &[
    ("NCCL_COLLNET_ENABLE", "0"),
    ("NCCL_GDRCOPY_ENABLE", "0"),
    ("NCCL_GIN_ENABLE", "0"),
    ("NCCL_MNNVL_ENABLE", "0"),
    ("NCCL_NVLS_ENABLE", "0"),
    ("NCCL_NVTX_DISABLE", "1"),
    ("NCCL_PXN_DISABLE", "1"),
];

/// Whether `value` of the not-built `name` asks for what oxccl does anyway.
fn agrees(name: &str, value: &str) -> bool {
    AGREEING.iter().any(|&(n, v)| {
        n == name
            && match (super::parse_int(value), super::parse_int(v)) {
                (Some(a), Some(b)) => a == b,
                _ => value.trim() == v,
            }
    })
}

/// The not-built settings that are set (environment, then the configuration files), with
/// their values, except those set to what oxccl does anyway ([`AGREEING`]).
pub fn set_ones() -> Vec<(&'static str, String)> {
    NOT_BUILT
        .iter()
        .filter_map(|&name| super::lookup_raw(name).map(|v| (name, v)))
        .filter(|(name, value)| !agrees(name, value))
        .collect()
}

/// Report each not-built setting that is set, once per process.
pub fn report_once() {
    static REPORTED: std::sync::Once = std::sync::Once::new();
    REPORTED.call_once(|| {
        for (name, value) in set_ones() {
            crate::info!(
                ENV,
                "{name} set by environment to {value}: not built in oxccl, ignored"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_sorted_and_apart_from_the_registry() {
        assert!(NOT_BUILT.windows(2).all(|w| w[0] < w[1]));
        for name in NOT_BUILT {
            assert!(name.starts_with("NCCL_"), "{name}");
            assert!(
                super::super::registry::ALL.iter().all(|p| p.name != *name),
                "{name} is read by the registry and listed as not built"
            );
        }
    }

    #[test]
    fn a_set_one_is_found() {
        super::super::tests::sources::with(&[("NCCL_CROSS_NIC", "1")], &[], || {
            assert_eq!(set_ones(), vec![("NCCL_CROSS_NIC", "1".to_string())]);
        });
    }

    #[test]
    fn a_feature_turned_off_that_oxccl_never_uses_is_not_reported() {
        let env = [("NCCL_NVLS_ENABLE", "0"), ("NCCL_PXN_DISABLE", "0x1")];
        super::super::tests::sources::with(&env, &[], || assert!(set_ones().is_empty()));
        let env = [("NCCL_NVLS_ENABLE", "1")];
        super::super::tests::sources::with(&env, &[], || {
            assert_eq!(set_ones(), vec![("NCCL_NVLS_ENABLE", "1".to_string())]);
        });
        for (name, _) in AGREEING {
            assert!(NOT_BUILT.contains(name), "{name}");
        }
    }
}
