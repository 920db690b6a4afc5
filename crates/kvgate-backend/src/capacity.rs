//! Which device a backend runs on, how much KV cache it is asked for, and what it reports back:
//! blocks, and the bytes each block takes there. A backend sizes its own cache (the CPU backend from
//! the host's available memory, a GPU backend from free device memory), so nothing above it reads
//! `/proc/meminfo` or a driver.

use serde::{Deserialize, Serialize};

use kvgate_kv::{CacheShape, KvError};

/// Where a model runs (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// CUDA device N.
    Cuda(u32),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        if t == "cpu" {
            return Ok(Device::Cpu);
        }
        if let Some(n) = t.strip_prefix("cuda:") {
            if let Ok(n) = n.parse() {
                return Ok(Device::Cuda(n));
            }
        }
        Err(format!("{s:?} is not a device: expected cpu or cuda:N"))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl TryFrom<String> for Device {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.to_string()
    }
}

/// How much KV cache a backend is asked to hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvMemory {
    /// Exactly this many blocks (`--num-kv-blocks`).
    Blocks(usize),
    /// As many blocks as fit in this many bytes (`--kv-cache-memory`).
    Bytes(u64),
    /// The backend's own default share of its device's memory.
    #[default]
    Auto,
}

impl KvMemory {
    /// The blocks of `shape` this asks for, with `auto` bytes standing for [`KvMemory::Auto`];
    /// also the bytes it stands for.
    pub fn resolve(self, shape: &CacheShape, auto: impl FnOnce() -> u64) -> Result<(usize, u64), KvError> {
        let per = shape.bytes_per_block() as u64;
        match self {
            KvMemory::Blocks(n) => Ok((n, n as u64 * per)),
            KvMemory::Bytes(b) => Ok((shape.blocks_for_bytes(b)?, b)),
            KvMemory::Auto => {
                let b = auto();
                Ok((shape.blocks_for_bytes(b)?, b))
            }
        }
    }
}

/// What a backend's cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Blocks in the cache.
    pub num_blocks: usize,
    /// Bytes one block takes on the device (all layers, K and V, scales included).
    pub bytes_per_block: usize,
    /// Bytes the cache was sized from (what `--kv-cache-memory` or the default gave; the blocks take
    /// `num_blocks × bytes_per_block` of it).
    pub budget_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_kv::KvDtype;

    #[test]
    fn devices_parse_and_print() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!(" CUDA:1 ".parse(), Ok(Device::Cuda(1)));
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("tpu".parse::<Device>().is_err());
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
    }

    #[test]
    fn memory_resolves_to_blocks() {
        let shape = CacheShape::new(2, 2, 8, 4, KvDtype::F32).unwrap();
        let per = shape.bytes_per_block() as u64;
        assert_eq!(KvMemory::Blocks(7).resolve(&shape, || 0), Ok((7, 7 * per)));
        assert_eq!(KvMemory::Bytes(3 * per + 1).resolve(&shape, || 0), Ok((3, 3 * per + 1)));
        assert_eq!(KvMemory::Auto.resolve(&shape, || 5 * per), Ok((5, 5 * per)));
        assert!(KvMemory::Bytes(1).resolve(&shape, || 0).is_err());
    }
}
