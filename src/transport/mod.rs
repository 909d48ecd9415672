//! Connections between ranks: P2P (peer pointers in one process, exported memory across
//! processes) and SHM (host shared memory), each giving the kernels plain device pointers.
