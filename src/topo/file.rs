//! Topology files (`NCCL_TOPO_FILE`): NVIDIA's XML description of a node, read into a typed
//! tree — CPUs (NUMA nodes), the PCI devices below each (switches, GPUs with their NVLinks,
//! NICs with their network devices) — and the places it gives the devices. Where the file says
//! something it replaces detection: a GPU's NVLink count (when its `<gpu>` lists `<nvlink>`
//! elements, as NVIDIA's, which then skips NVML), the PCI places of GPUs and network devices
//! for the GPU–NIC affinity (`Locator`), and a network device's speed (`net_speed`, below
//! `OXCCL_NET_SPEEDS`). Devices the file does not mention keep what was detected.
//!
//! The format (`src/graph/xml.cc`, `topo.cc` of NVIDIA's library):
//! `<system version="1"><cpu numaid=".."><pci busid=".." class=".." link_speed=".."
//! link_width=".."><pci busid=".."><gpu dev=".." sm=".." rank=".." gdr=".."><nvlink
//! target=".." count=".." tclass=".."/></gpu></pci><pci busid=".."><nic><net name=".."
//! dev=".." speed=".." port=".." gdr=".."/></nic></pci></pci></cpu></system>`, speeds in
//! Mbit/s. A `pci` element is a device at that bus id; the `pci` elements around it are the
//! PCI switches above it (nearest first, as `topo::pci::Place` has them), its `cpu` its NUMA
//! node. A `nic` directly in a `cpu` is a network device without a PCI path. Every attribute
//! is kept, in file order, so a file written back (`NodeFile::to_xml`) says what it said.
//! Elements the reader does not know are skipped with an INFO line, as NVIDIA's.
//!
//! Required: `system.version` (1), `cpu.numaid`, `pci.busid`, `nvlink.count`, `net.name`; a
//! file missing one, with a malformed number, a bus id or network device twice, or not
//! well-formed is `ncclInvalidUsage` naming the file and line.

use super::pci::{is_bus_id, Locate, Place, Sysfs};
use super::xml::{self, Element};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// The one version of the format (NVIDIA's `NCCL_TOPO_XML_VERSION`).
pub const XML_VERSION: i64 = 1;

/// Largest topology file read (NVIDIA's reader caps nodes; a node's file is a few KiB).
const MAX_FILE_BYTES: u64 = 16 << 20;

/// Attributes as written, in file order.
pub type Attrs = Vec<(String, String)>;

/// A node as its topology file describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFile {
    /// The `system` element's attributes (`version`, perhaps `name`).
    pub attrs: Attrs,
    pub cpus: Vec<Cpu>,
}

/// A CPU socket / NUMA node and what hangs below it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cpu {
    pub numa: i32,
    pub attrs: Attrs,
    pub pcis: Vec<Pci>,
    /// Network devices without a PCI path.
    pub nics: Vec<Nic>,
}

/// A PCI device: a switch (with devices below it), a GPU, a NIC or something else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pci {
    /// Lower case, `DDDD:BB:DD.F`.
    pub bus_id: String,
    pub attrs: Attrs,
    pub gpu: Option<Gpu>,
    pub nic: Option<Nic>,
    pub children: Vec<Pci>,
}

/// A GPU: its attributes (`dev`, `sm`, `rank`, `gdr`) and NVLinks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub attrs: Attrs,
    pub nvlinks: Vec<NvLink>,
}

/// `count` NVLinks to `target` (a GPU's bus id, or an NVSwitch / CPU by `tclass`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvLink {
    pub target: Option<String>,
    pub count: u32,
    pub attrs: Attrs,
}

/// A NIC and its network devices (ports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    pub attrs: Attrs,
    pub nets: Vec<Net>,
}

/// A network device, by the name the network gives it (`ncclNetProperties_t.name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Net {
    pub name: String,
    /// Mbit/s; None where absent or not positive (NVIDIA's reader then assumes 10000).
    pub speed_mbps: Option<u32>,
    pub port: Option<i32>,
    pub gdr: Option<bool>,
    pub attrs: Attrs,
}

impl Pci {
    /// Whether the device is a GPU: a `<gpu>` inside, or a display / 3D controller class.
    pub fn is_gpu(&self) -> bool {
        self.gpu.is_some() || attr(&self.attrs, "class").is_some_and(|c| c.starts_with("0x03"))
    }
}

fn attr<'a>(attrs: &'a Attrs, key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// `DDDD:BB:DD.F` of a bus id as written (any case; `BB:DD.F` is in domain 0), None when it
/// is none.
pub fn normalize_bus_id(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    let s = if s.len() == 7 { format!("0000:{s}") } else { s };
    is_bus_id(&s).then_some(s)
}

/// What reading a file's elements needs: its name for messages, and the bus ids and network
/// device names seen so far (each may appear once).
struct Reading<'a> {
    source: &'a str,
    bus_ids: HashMap<String, usize>,
    nets: HashMap<String, usize>,
}

impl Reading<'_> {
    fn error(&self, line: usize, msg: impl std::fmt::Display) -> Error {
        Error::invalid_usage(format!("NCCL_TOPO_FILE {}:{line}: {msg}", self.source))
    }

    fn required<'e>(&self, e: &'e Element, key: &str) -> Result<&'e str> {
        e.attr(key)
            .ok_or_else(|| self.error(e.line, format!("<{}> without attribute '{key}'", e.name)))
    }

    /// Attribute `key` of `e` as an integer (decimal or `0x` hexadecimal), None when absent.
    fn int(&self, e: &Element, key: &str) -> Result<Option<i64>> {
        let Some(v) = e.attr(key) else {
            return Ok(None);
        };
        crate::env::parse_int(v).map(Some).ok_or_else(|| {
            self.error(
                e.line,
                format!("<{}> {key}=\"{v}\" is not an integer", e.name),
            )
        })
    }

    /// Attribute `key` of `e` as an integer within `lo..=hi`.
    fn int_in(&self, e: &Element, key: &str, lo: i64, hi: i64) -> Result<Option<i64>> {
        match self.int(e, key)? {
            Some(n) if n < lo || n > hi => Err(self.error(
                e.line,
                format!("<{}> {key}=\"{n}\" is out of range ({lo}..{hi})", e.name),
            )),
            n => Ok(n),
        }
    }

    fn ignore(&self, e: &Element, parent: &str) {
        crate::info!(
            GRAPH,
            "NCCL_TOPO_FILE {}:{} : ignoring element {} in {parent}",
            self.source,
            e.line,
            e.name
        );
    }

    fn system(&mut self, e: &Element) -> Result<NodeFile> {
        if e.name != "system" {
            return Err(self.error(e.line, format!("<{}> where <system> was expected", e.name)));
        }
        self.required(e, "version")?;
        let version = self.int(e, "version")?.unwrap_or(0);
        if version != XML_VERSION {
            return Err(self.error(
                e.line,
                format!("XML Topology has wrong version {version}, {XML_VERSION} needed"),
            ));
        }
        let mut cpus = Vec::new();
        for c in &e.children {
            match c.name.as_str() {
                "cpu" => cpus.push(self.cpu(c)?),
                _ => self.ignore(c, "system"),
            }
        }
        Ok(NodeFile {
            attrs: e.attrs.clone(),
            cpus,
        })
    }

    fn cpu(&mut self, e: &Element) -> Result<Cpu> {
        self.required(e, "numaid")?;
        let numa = self.int_in(e, "numaid", -1, i32::MAX as i64)?.unwrap_or(-1) as i32;
        let mut cpu = Cpu {
            numa,
            attrs: e.attrs.clone(),
            pcis: Vec::new(),
            nics: Vec::new(),
        };
        for c in &e.children {
            match c.name.as_str() {
                "pci" => cpu.pcis.push(self.pci(c)?),
                "nic" => cpu.nics.push(self.nic(c)?),
                _ => self.ignore(c, "cpu"),
            }
        }
        Ok(cpu)
    }

    fn pci(&mut self, e: &Element) -> Result<Pci> {
        let written = self.required(e, "busid")?;
        let bus_id = normalize_bus_id(written).ok_or_else(|| {
            self.error(
                e.line,
                format!("busid=\"{written}\" is not a PCI bus id (DDDD:BB:DD.F)"),
            )
        })?;
        if let Some(first) = self.bus_ids.insert(bus_id.clone(), e.line) {
            return Err(self.error(
                e.line,
                format!("bus id {bus_id} twice (first on line {first})"),
            ));
        }
        self.int_in(e, "link_width", 0, 64)?;
        let mut pci = Pci {
            bus_id,
            attrs: e.attrs.clone(),
            gpu: None,
            nic: None,
            children: Vec::new(),
        };
        for c in &e.children {
            match c.name.as_str() {
                "pci" => pci.children.push(self.pci(c)?),
                "gpu" if pci.gpu.is_none() => pci.gpu = Some(self.gpu(c)?),
                "nic" if pci.nic.is_none() => pci.nic = Some(self.nic(c)?),
                "gpu" | "nic" => {
                    return Err(self.error(
                        c.line,
                        format!("a second <{}> in <pci busid=\"{}\">", c.name, pci.bus_id),
                    ))
                }
                _ => self.ignore(c, "pci"),
            }
        }
        Ok(pci)
    }

    fn gpu(&mut self, e: &Element) -> Result<Gpu> {
        for key in ["dev", "sm", "rank"] {
            self.int(e, key)?;
        }
        self.int_in(e, "gdr", 0, 1)?;
        let mut gpu = Gpu {
            attrs: e.attrs.clone(),
            nvlinks: Vec::new(),
        };
        for c in &e.children {
            match c.name.as_str() {
                "nvlink" => gpu.nvlinks.push(self.nvlink(c)?),
                _ => self.ignore(c, "gpu"),
            }
        }
        Ok(gpu)
    }

    fn nvlink(&mut self, e: &Element) -> Result<NvLink> {
        self.required(e, "count")?;
        let count = self.int_in(e, "count", 0, 1024)?.unwrap_or(0) as u32;
        Ok(NvLink {
            target: e.attr("target").map(str::to_ascii_lowercase),
            count,
            attrs: e.attrs.clone(),
        })
    }

    fn nic(&mut self, e: &Element) -> Result<Nic> {
        let mut nic = Nic {
            attrs: e.attrs.clone(),
            nets: Vec::new(),
        };
        for c in &e.children {
            match c.name.as_str() {
                "net" => nic.nets.push(self.net(c)?),
                _ => self.ignore(c, "nic"),
            }
        }
        Ok(nic)
    }

    fn net(&mut self, e: &Element) -> Result<Net> {
        let name = self.required(e, "name")?.to_string();
        if name.is_empty() {
            return Err(self.error(e.line, "<net> with an empty name"));
        }
        if let Some(first) = self.nets.insert(name.clone(), e.line) {
            return Err(self.error(
                e.line,
                format!("network device {name} twice (first on line {first})"),
            ));
        }
        let speed = self.int_in(e, "speed", i64::from(i32::MIN), u32::MAX as i64)?;
        let port = self.int_in(e, "port", 0, i32::MAX as i64)?;
        let gdr = self.int_in(e, "gdr", 0, 1)?;
        for key in ["dev", "maxconn"] {
            self.int(e, key)?;
        }
        if let Some(latency) = e.attr("latency") {
            if latency.trim().parse::<f64>().is_err() {
                return Err(self.error(
                    e.line,
                    format!("<net> latency=\"{latency}\" is not a number"),
                ));
            }
        }
        Ok(Net {
            name,
            speed_mbps: speed.filter(|&s| s > 0).map(|s| s as u32),
            port: port.map(|p| p as i32),
            gdr: gdr.map(|g| g == 1),
            attrs: e.attrs.clone(),
        })
    }
}

/// Every PCI device of `pcis` (and below) with its place, below `above` (nearest first) on
/// NUMA node `numa`.
fn walk<'a>(pcis: &'a [Pci], above: &[String], numa: i32, out: &mut Vec<(&'a Pci, Place)>) {
    for p in pcis {
        out.push((
            p,
            Place {
                switches: above.to_vec(),
                numa,
            },
        ));
        if !p.children.is_empty() {
            let mut below = vec![p.bus_id.clone()];
            below.extend_from_slice(above);
            walk(&p.children, &below, numa, out);
        }
    }
}

impl NodeFile {
    /// The node `text` describes; `source` (the file's name) goes into error messages.
    pub fn parse(text: &str, source: &str) -> Result<NodeFile> {
        let root = xml::parse(text).map_err(|e| {
            Error::invalid_usage(format!("NCCL_TOPO_FILE {source}:{}: {}", e.line, e.msg))
        })?;
        Reading {
            source,
            bus_ids: HashMap::new(),
            nets: HashMap::new(),
        }
        .system(&root)
    }

    /// The node the file at `path` describes.
    pub fn load(path: &str) -> Result<NodeFile> {
        let unreadable =
            |e: std::io::Error| Error::invalid_usage(format!("NCCL_TOPO_FILE {path}: {e}"));
        let meta = std::fs::metadata(path).map_err(unreadable)?;
        if !meta.is_file() {
            return Err(Error::invalid_usage(format!(
                "NCCL_TOPO_FILE {path}: not a regular file"
            )));
        }
        let len = meta.len();
        if len > MAX_FILE_BYTES {
            return Err(Error::invalid_usage(format!(
                "NCCL_TOPO_FILE {path}: {len} bytes, more than a topology file's {MAX_FILE_BYTES}"
            )));
        }
        let bytes = std::fs::read(path).map_err(unreadable)?;
        NodeFile::parse(&String::from_utf8_lossy(&bytes), path)
    }

    /// The `name` attribute of `<system>`, if any.
    pub fn name(&self) -> Option<&str> {
        attr(&self.attrs, "name")
    }

    /// The file in NVIDIA's layout.
    pub fn to_xml(&self) -> String {
        xml::write(&self.to_element())
    }

    fn to_element(&self) -> Element {
        let mut e = element("system", &self.attrs);
        for cpu in &self.cpus {
            let mut c = element("cpu", &cpu.attrs);
            c.children.extend(cpu.pcis.iter().map(pci_element));
            c.children.extend(cpu.nics.iter().map(nic_element));
            e.children.push(c);
        }
        e
    }

    /// Every PCI device with its place.
    pub fn pcis(&self) -> Vec<(&Pci, Place)> {
        let mut out = Vec::new();
        for cpu in &self.cpus {
            walk(&cpu.pcis, &[], cpu.numa, &mut out);
        }
        out
    }

    /// The place of the PCI device `bus_id`, if the file has it.
    pub fn pci_place(&self, bus_id: &str) -> Option<Place> {
        let id = normalize_bus_id(bus_id)?;
        self.pcis()
            .into_iter()
            .find(|(p, _)| p.bus_id == id)
            .map(|(_, place)| place)
    }

    /// The bus ids of the GPUs, in bus id order (NVML's).
    pub fn gpu_bus_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .pcis()
            .into_iter()
            .filter(|(p, _)| p.is_gpu())
            .map(|(p, _)| p.bus_id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// The NVLinks of the GPU `bus_id` when the file lists them (its `<gpu>` has `<nvlink>`
    /// elements): their counts added.
    pub fn gpu_nvlinks(&self, bus_id: &str) -> Option<u32> {
        let id = normalize_bus_id(bus_id)?;
        self.pcis()
            .into_iter()
            .find(|(p, _)| p.bus_id == id)
            .and_then(|(p, _)| p.gpu.as_ref())
            .filter(|g| !g.nvlinks.is_empty())
            .map(|g| g.nvlinks.iter().map(|l| l.count).sum())
    }

    /// Every network device with its place and its NIC's bus id (None: no PCI path).
    pub fn nets(&self) -> Vec<(&Net, Place, Option<&str>)> {
        let mut out = Vec::new();
        for (p, place) in self.pcis() {
            for n in p.nic.iter().flat_map(|nic| &nic.nets) {
                out.push((n, place.clone(), Some(p.bus_id.as_str())));
            }
        }
        for cpu in &self.cpus {
            let place = Place {
                switches: Vec::new(),
                numa: cpu.numa,
            };
            for n in cpu.nics.iter().flat_map(|nic| &nic.nets) {
                out.push((n, place.clone(), None));
            }
        }
        out
    }

    /// The network device named `name` and its place, if the file has it.
    pub fn net(&self, name: &str) -> Option<(&Net, Place)> {
        self.nets()
            .into_iter()
            .find(|(n, _, _)| n.name == name)
            .map(|(n, place, _)| (n, place))
    }

    /// The speed the file gives the network device `name`, if it gives one.
    pub fn net_speed(&self, name: &str) -> Option<u32> {
        self.net(name).and_then(|(n, _)| n.speed_mbps)
    }
}

fn element(name: &str, attrs: &Attrs) -> Element {
    let mut e = Element::new(name);
    e.attrs = attrs.clone();
    e
}

fn pci_element(p: &Pci) -> Element {
    let mut e = element("pci", &p.attrs);
    if let Some(g) = &p.gpu {
        let mut ge = element("gpu", &g.attrs);
        ge.children
            .extend(g.nvlinks.iter().map(|l| element("nvlink", &l.attrs)));
        e.children.push(ge);
    }
    if let Some(n) = &p.nic {
        e.children.push(nic_element(n));
    }
    e.children.extend(p.children.iter().map(pci_element));
    e
}

fn nic_element(n: &Nic) -> Element {
    let mut e = element("nic", &n.attrs);
    e.children
        .extend(n.nets.iter().map(|net| element("net", &net.attrs)));
    e
}

/// The places of a node's devices: the topology file's where it has them, else sysfs's. A
/// network device is found in the file by its name, else by the bus id its PCI path ends in.
pub struct Locator {
    pub sysfs: Sysfs,
    pub file: Option<Arc<NodeFile>>,
}

impl Locator {
    /// The machine's sysfs under the file `NCCL_TOPO_FILE` names, if any.
    pub fn system() -> Result<Locator> {
        Ok(Locator {
            sysfs: Sysfs::system(),
            file: from_env()?,
        })
    }
}

/// The bus id a PCI path (`/sys/devices/pci0000:15/.../0000:1a:00.0`) ends in.
fn last_bus_id(pci_path: &str) -> Option<String> {
    pci_path
        .rsplit('/')
        .find(|c| !c.is_empty())
        .and_then(normalize_bus_id)
}

/// The INFO line of a place the file gives `what`, once.
fn say_placed(what: &str, place: &Place) {
    let switches = match place.switches.is_empty() {
        true => "no PCI switch".to_string(),
        false => format!("PCI switches {}", place.switches.join(" < ")),
    };
    say_once(
        format!(
            "Topology file : {what} below {switches} on CPU {}",
            place.numa
        ),
        false,
    );
}

impl Locate for Locator {
    fn gpu_place(&self, bus_id: &str) -> Option<Place> {
        let file = self.file.as_ref().and_then(|f| f.pci_place(bus_id));
        if let Some(place) = &file {
            say_placed(&format!("GPU {bus_id}"), place);
        }
        file.or_else(|| self.sysfs.gpu_place(bus_id))
    }

    fn net_place(&self, name: &str, pci_path: &str) -> Option<Place> {
        let file = self.file.as_ref().and_then(|f| {
            f.net(name)
                .map(|(_, place)| place)
                .or_else(|| last_bus_id(pci_path).and_then(|b| f.pci_place(&b)))
        });
        if let Some(place) = &file {
            say_placed(&format!("network device {name}"), place);
        }
        file.or_else(|| self.sysfs.net_place(name, pci_path))
    }

    fn gpu_ordinal(&self, bus_id: &str) -> Option<usize> {
        let id = normalize_bus_id(bus_id)?;
        let file = self
            .file
            .as_ref()
            .and_then(|f| f.gpu_bus_ids().iter().position(|g| *g == id));
        file.or_else(|| self.sysfs.gpu_ordinal(bus_id))
    }
}

/// The file `NCCL_TOPO_FILE` names, read once per path (INFO `Loading topology file ...`);
/// None when unset or when it cannot be opened (a warning, as NVIDIA's goes on without it).
pub fn from_env() -> Result<Option<Arc<NodeFile>>> {
    static LOADED: parking_lot::Mutex<Option<(String, Arc<NodeFile>)>> =
        parking_lot::Mutex::new(None);
    let Some(path) = crate::env::registry::TOPO_FILE
        .get()
        .filter(|p| !p.trim().is_empty())
    else {
        return Ok(None);
    };
    let mut loaded = LOADED.lock();
    if let Some((p, file)) = loaded.as_ref() {
        if *p == path {
            return Ok(Some(file.clone()));
        }
    }
    if let Err(e) = std::fs::metadata(&path) {
        say_once(
            format!("Could not open XML topology file {path} : {e}"),
            true,
        );
        return Ok(None);
    }
    crate::info!(GRAPH, "Loading topology file {path}");
    let file = Arc::new(NodeFile::load(&path)?);
    match file.name() {
        Some(name) => crate::info!(GRAPH, "Loading topology {name}"),
        None => crate::info!(GRAPH, "Loading unnamed topology"),
    }
    crate::info!(
        GRAPH,
        "Topology file {path} : {} CPUs, {} PCI devices, {} GPUs, {} network devices; they \
         replace detected NVLink counts, PCI places and network speeds where it gives them",
        file.cpus.len(),
        file.pcis().len(),
        file.gpu_bus_ids().len(),
        file.nets().len()
    );
    *loaded = Some((path, file.clone()));
    Ok(Some(file))
}

/// Log `line` (INFO, GRAPH; or a warning) the first time it is said in this process: the
/// overrides are consulted on every communicator's init.
pub fn say_once(line: String, warn: bool) {
    static SAID: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());
    let mut said = SAID.lock();
    if said.contains(&line) {
        return;
    }
    match warn {
        true => crate::warn!("{line}"),
        false => crate::info!(GRAPH, "{line}"),
    }
    said.push(line);
}

/// The NVLink count of the GPU `bus_id`: the file's (`NodeFile::gpu_nvlinks`), else
/// `detected`.
pub fn nvlinks_of(file: Option<&NodeFile>, bus_id: &str, detected: u32) -> u32 {
    match file.and_then(|f| f.gpu_nvlinks(bus_id)) {
        Some(n) => {
            if n != detected {
                say_once(
                    format!("Topology file : GPU {bus_id} has {n} NVLinks (detected {detected})"),
                    false,
                );
            }
            n
        }
        None => detected,
    }
}

/// This rank's GPU's NVLink count under `NCCL_TOPO_FILE` (`nvlinks_of`), `detect` giving
/// the detected one.
pub fn nvlinks(bus_id: &str, detect: impl FnOnce() -> u32) -> Result<u32> {
    let file = from_env()?;
    Ok(nvlinks_of(file.as_deref(), bus_id, detect()))
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
