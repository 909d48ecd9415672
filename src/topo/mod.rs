//! Node topology: the GPUs of this host, their PCI ids, which pairs reach each other's memory
//! and over what (NVLink count and bandwidth, PCIe), and which ranks share a host.
