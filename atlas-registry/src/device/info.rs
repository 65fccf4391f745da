//! What a device is and has, as an engine sizes its work by it: its identity ([`DeviceUuid`],
//! [`PciBusId`]), its memory now ([`MemoryInfo`]), and its attributes (any `CUdevice_attribute`,
//! and by name the ones engines use most). Each is asked of the driver when called: nothing here
//! changes what creating a [`CudaHost`] costs.

use std::fmt;

use atlas_sys::CUdevice_attribute as Attr;

use crate::device::context::CudaContext;
use crate::device::host::CudaHost;
use crate::device::limits::attribute;
use crate::driver::{About, calls};
use crate::error::{AtlasError, Result};

/// A device's UUID, 16 bytes, displayed as `nvidia-smi` shows a GPU's:
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, in lowercase hexadecimal.
///
/// # Examples
///
/// ```
/// use atlas_registry::DeviceUuid;
/// let uuid = DeviceUuid::from_bytes([
///     0x5c, 0x1e, 0x32, 0x9a, 0x07, 0x44, 0x8f, 0x2b, 0x91, 0x0d, 0xe6, 0x73, 0x4a, 0xb8, 0x00, 0x01,
/// ]);
/// assert_eq!(uuid.to_string(), "GPU-5c1e329a-0744-8f2b-910d-e6734ab80001");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceUuid([u8; 16]);

impl DeviceUuid {
    /// The UUID of these bytes, in the driver's order.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The 16 bytes, in the driver's order.
    pub const fn bytes(&self) -> [u8; 16] {
        self.0
    }
}

impl fmt::Display for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU")?;
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 0 | 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceUuid({self})")
    }
}

/// A device's PCI address: `domain:bus:device.function`, displayed in lowercase hexadecimal as
/// Linux names PCI devices (`0000:1b:00.0`); `nvidia-smi` writes the same address with an
/// eight-digit domain (`00000000:1B:00.0`), which [`parse`](Self::parse) reads too.
///
/// # Examples
///
/// ```
/// use atlas_registry::PciBusId;
/// let id = PciBusId::parse("00000000:1B:00.0").unwrap();
/// assert_eq!((id.domain, id.bus, id.device, id.function), (0, 0x1b, 0, 0));
/// assert_eq!(id.to_string(), "0000:1b:00.0");
/// assert_eq!(PciBusId::parse("0000:1b:00"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciBusId {
    /// The PCI domain (segment).
    pub domain: u32,
    /// The bus number.
    pub bus: u8,
    /// The device number on the bus (0 to 31).
    pub device: u8,
    /// The function number (0 to 7).
    pub function: u8,
}

impl PciBusId {
    /// Reads `domain:bus:device.function` in hexadecimal, either case (what
    /// `cuDeviceGetPCIBusId` and `nvidia-smi` write); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let (domain, rest) = text.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |digits: &str, most: usize| {
            let plain = !digits.is_empty()
                && digits.len() <= most
                && digits.bytes().all(|b| b.is_ascii_hexdigit());
            plain
                .then(|| u32::from_str_radix(digits, 16).ok())
                .flatten()
        };
        let id = Self {
            domain: hex(domain, 8)?,
            bus: u8::try_from(hex(bus, 2)?).ok()?,
            device: u8::try_from(hex(device, 2)?).ok()?,
            function: u8::try_from(hex(function, 1)?).ok()?,
        };
        (id.device < 32 && id.function < 8).then_some(id)
    }
}

impl fmt::Display for PciBusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// A device's memory at one moment, in bytes ([`CudaContext::memory_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Free now: what allocations of any process on the device may still take.
    pub free: usize,
    /// The device's memory in all.
    pub total: usize,
}

impl CudaContext {
    /// The device's free and total memory now (`cuMemGetInfo_v2`, with this context made current
    /// whatever context the thread had: `cuCtxGetCurrent`, then one `cuMemGetInfo_v2`). Free
    /// memory counts every process's allocations on the device.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> atlas_registry::Result<()> {
    /// let memory = atlas_registry::host(0)?.context().memory_info()?;
    /// // Size a key-value cache to 90% of what is free.
    /// let cache_bytes = memory.free / 10 * 9;
    /// assert!(memory.free <= memory.total);
    /// # let _ = cache_bytes; Ok(()) }
    /// ```
    #[doc(alias = "cuMemGetInfo")]
    #[doc(alias = "cuMemGetInfo_v2")]
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        self.bind()?;
        let (free, total) = calls::mem_get_info().about(|| format!("device {}", self.ordinal()))?;
        Ok(MemoryInfo { free, total })
    }
}

impl CudaHost {
    /// The device's UUID (`cuDeviceGetUuid_v2`, or `cuDeviceGetUuid` on drivers older than CUDA
    /// 11.4): the name that stays with a GPU whatever its ordinal, as `nvidia-smi` and
    /// `CUDA_VISIBLE_DEVICES` know it. One driver call.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> atlas_registry::Result<()> {
    /// let host = atlas_registry::host(0)?;
    /// println!("{} {} at {}", host.name(), host.uuid()?, host.pci_bus_id()?);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuDeviceGetUuid")]
    #[doc(alias = "cuDeviceGetUuid_v2")]
    pub fn uuid(&self) -> Result<DeviceUuid> {
        let bytes = calls::device_uuid(self.context().device()).about(|| self.subject())?;
        Ok(DeviceUuid(bytes))
    }

    /// The device's PCI address (`cuDeviceGetPCIBusId`). One driver call. An answer Atlas cannot
    /// read is an [`AtlasError::DriverAnswer`] quoting it.
    #[doc(alias = "cuDeviceGetPCIBusId")]
    pub fn pci_bus_id(&self) -> Result<PciBusId> {
        let text = calls::device_pci_bus_id(self.context().device()).about(|| self.subject())?;
        PciBusId::parse(&text).ok_or_else(|| AtlasError::DriverAnswer {
            call: "cuDeviceGetPCIBusId",
            device: self.ordinal(),
            answer: text,
            expected: "domain:bus:device.function in hexadecimal",
        })
    }

    /// Any attribute of the device (`cuDeviceGetAttribute`), as the driver answers it (some are
    /// signed: `CU_DEVICE_ATTRIBUTE_NUMA_ID` is -1 off NUMA systems). One driver call; an
    /// attribute the driver does not know is its `CUDA_ERROR_INVALID_VALUE`.
    ///
    /// The launch limits are read once, in [`limits`](Self::limits): the multiprocessor count is
    /// `limits().multiprocessors` (132 on an H100 SXM or H200). The attributes below have methods
    /// of their own.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn f() -> atlas_registry::Result<()> {
    /// use atlas_registry::sys::CUdevice_attribute as Attr;
    /// let host = atlas_registry::host(0)?;
    /// let warp = host.attribute(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?;
    /// assert_eq!(warp, 32);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cuDeviceGetAttribute")]
    pub fn attribute(&self, attribute: Attr) -> Result<i32> {
        calls::device_attribute(self.context().device(), attribute)
            .about(|| format!("{}, attribute {}", self.subject(), attribute.0))
            .map_err(AtlasError::from)
    }

    /// The L2 cache, in bytes (`CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE`). One driver call.
    pub fn l2_cache_bytes(&self) -> Result<u32> {
        self.counted(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
    }

    /// The peak memory clock, in kilohertz (`CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE`). One driver
    /// call. With [`memory_bus_width_bits`](Self::memory_bus_width_bits), the peak memory
    /// bandwidth is `2 × clock × width / 8` bytes per second (double data rate).
    pub fn memory_clock_khz(&self) -> Result<u32> {
        self.counted(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
    }

    /// The width of the memory bus, in bits (`CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH`). One
    /// driver call.
    pub fn memory_bus_width_bits(&self) -> Result<u32> {
        self.counted(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
    }

    /// Most threads resident on one multiprocessor at once
    /// (`CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR`, 2048 on an H200). One driver call.
    pub fn max_threads_per_multiprocessor(&self) -> Result<u32> {
        self.counted(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
    }

    /// An attribute that counts something (a negative answer reads as 0).
    fn counted(&self, which: Attr) -> Result<u32> {
        attribute(self.context().device(), which, self.ordinal())
    }

    fn subject(&self) -> String {
        format!("device {}", self.ordinal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_are_read_as_the_driver_and_nvidia_smi_write_them() {
        let id = |domain, bus, device, function| PciBusId {
            domain,
            bus,
            device,
            function,
        };
        for (text, expected) in [
            ("0000:1b:00.0", id(0, 0x1b, 0, 0)),
            ("0000:1B:00.0", id(0, 0x1b, 0, 0)),
            ("00000000:1B:00.0", id(0, 0x1b, 0, 0)),
            ("0001:c1:1f.7", id(1, 0xc1, 0x1f, 7)),
            ("ffffffff:ff:1f.7", id(u32::MAX, 0xff, 0x1f, 7)),
        ] {
            assert_eq!(PciBusId::parse(text), Some(expected), "{text}");
        }
        assert_eq!(id(1, 0xc1, 0x1f, 7).to_string(), "0001:c1:1f.7");
        for bad in [
            "",
            "0000:1b:00",
            "0000:1b.00.0",
            "0000:1g:00.0",
            "0000:1b:20.0",
            "0000:1b:00.8",
            "0000:100:00.0",
            "000000000:1b:00.0",
            "+000:1b:00.0",
            "0000::00.0",
            "0000:1b:00.0 ",
            "0000:1b:00.0.0",
        ] {
            assert_eq!(PciBusId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_uuid_reads_as_nvidia_smi_prints_it() {
        let mut bytes = [0u8; 16];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8) * 17;
        }
        let uuid = DeviceUuid::from_bytes(bytes);
        assert_eq!(uuid.to_string(), "GPU-00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(uuid.bytes(), bytes);
        assert_eq!(
            format!("{uuid:?}"),
            "DeviceUuid(GPU-00112233-4455-6677-8899-aabbccddeeff)"
        );
    }
}
