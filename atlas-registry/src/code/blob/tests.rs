//! The checks on the committed blobs: every one passes, and each class of refusal is shown on a
//! real cubin (NVRTC 12.0's), the committed fatbin or a bundle with one field broken. Offsets,
//! section indexes and counts are read from the blob, so the expected refusals follow the layout
//! of whatever toolchain made it.

use std::borrow::Cow;

use atlas_kernels::{CUBIN_ARCHS, ELEMENTWISE_FATBIN, MODELS, cubin_for_model, ptx_for_model};

use super::read::{Check, Size};
use super::*;

/// The committed cubin of demo module `module` for `sm`.
fn cubin(module: &str, sm: u32) -> &'static [u8] {
    cubin_for_model("demo", sm)
        .unwrap()
        .iter()
        .find(|(name, _)| *name == module)
        .unwrap()
        .1
}

/// The committed sm_90 cubin of demo module `module`.
fn demo_cubin(module: &str) -> &'static [u8] {
    cubin(module, 90)
}

/// `validate_blob`'s check: every entry any device may pick.
fn check(blob: &[u8]) -> Check<BlobKind> {
    super::check(blob, Some(Devices::Every)).map_err(said)
}

/// What `refusal` says: the reason of a structural one, else all of it.
fn said(refusal: Refusal) -> String {
    match refusal {
        Refusal::Malformed(reason) => reason,
        other => format!("{other:?}"),
    }
}

/// The load path's preparation of `blob` (of a known format): its kind and the bytes handed over.
fn prepare<'b>(module: &str, blob: &'b [u8]) -> Result<(BlobKind, Cow<'b, [u8]>)> {
    super::prepare(module, blob, false)
}

fn refusal(blob: &[u8]) -> String {
    match check(blob) {
        Ok(kind) => panic!("a {kind:?} blob passed that should not have"),
        Err(reason) => reason,
    }
}

#[track_caller]
fn assert_refused(blob: &[u8], words: &[&str]) {
    let reason = refusal(blob);
    for word in words {
        assert!(reason.contains(word), "{reason:?} does not say {word:?}");
    }
}

#[track_caller]
fn assert_passes(blob: &[u8]) {
    assert_eq!(check(blob), Ok(BlobKind::Cubin));
}

const SH_NAME: usize = 0;
const SH_TYPE: usize = 4;
const SH_FLAGS: usize = 8;
const SH_OFFSET: usize = 24;
const SH_SIZE: usize = 32;
const SH_LINK: usize = 40;
const SH_INFO: usize = 44;
const SH_ALIGN: usize = 48;
const SH_ENTSIZE: usize = 56;

const SHT_SYMTAB: u32 = 2;
const SHT_RELA: u32 = 4;
const SHT_NOTE: u32 = 7;
const SHT_REL: u32 = 9;
const SHT_CUDA_INFO: u32 = 0x7000_0000;
const SHF_INFO_LINK: u64 = 0x40;

/// A copy of a real ELF image with fields to break, found by name.
#[derive(Clone)]
struct Image {
    b: Vec<u8>,
}

impl Image {
    fn new(b: &[u8]) -> Self {
        Self { b: b.to_vec() }
    }

    fn u16(&self, at: usize) -> u16 {
        u16::from_le_bytes(self.b[at..at + 2].try_into().unwrap())
    }

    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.b[at..at + 4].try_into().unwrap())
    }

    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.b[at..at + 8].try_into().unwrap())
    }

    fn set(&mut self, at: usize, bytes: &[u8]) -> &mut Self {
        self.b[at..at + bytes.len()].copy_from_slice(bytes);
        self
    }

    /// A copy with `bytes` at `at`.
    fn with(&self, at: usize, bytes: &[u8]) -> Vec<u8> {
        let mut image = self.clone();
        image.set(at, bytes);
        image.b
    }

    fn len(&self) -> usize {
        self.b.len()
    }

    fn shnum(&self) -> usize {
        usize::from(self.u16(60))
    }

    fn header_of(&self, index: usize) -> usize {
        self.u64(40) as usize + 64 * index
    }

    /// The name of section `index`.
    fn name_of(&self, index: usize) -> String {
        let names = self.u64(self.header_of(usize::from(self.u16(62))) + SH_OFFSET) as usize;
        let at = names + self.u32(self.header_of(index)) as usize;
        let end = at + self.b[at..].iter().position(|&c| c == 0).unwrap();
        String::from_utf8(self.b[at..end].to_vec()).unwrap()
    }

    /// The index of the section called `name`.
    fn index(&self, name: &str) -> usize {
        (0..self.shnum())
            .find(|&i| self.name_of(i) == name)
            .unwrap_or_else(|| panic!("no section {name}"))
    }

    /// `section 7 (.nv.info.scale)`, as refusals name it.
    fn label(&self, name: &str) -> String {
        format!("section {} ({name})", self.index(name))
    }

    /// Where field `field` (byte offset in a section header) of section `name` is.
    fn field(&self, name: &str, field: usize) -> usize {
        self.header_of(self.index(name)) + field
    }

    /// A copy with field `field` of section `name` set to `bytes`.
    fn with_field(&self, name: &str, field: usize, bytes: &[u8]) -> Vec<u8> {
        self.with(self.field(name, field), bytes)
    }

    /// Where the bytes of section `name` start.
    fn data(&self, name: &str) -> usize {
        self.u64(self.field(name, SH_OFFSET)) as usize
    }

    fn size(&self, name: &str) -> u64 {
        self.u64(self.field(name, SH_SIZE))
    }

    /// How many symbols `.symtab` has.
    fn symbols(&self) -> u64 {
        self.size(".symtab") / 24
    }

    /// Where symbol `n` is.
    fn symbol(&self, n: usize) -> usize {
        self.data(".symtab") + 24 * n
    }

    /// The index of the symbol called `name`.
    fn symbol_named(&self, name: &str) -> usize {
        let strings = self.data(".strtab");
        (0..self.symbols() as usize)
            .find(|&n| {
                let at = strings + self.u32(self.symbol(n)) as usize;
                self.b[at..].starts_with(name.as_bytes()) && self.b[at + name.len()] == 0
            })
            .unwrap_or_else(|| panic!("no symbol {name}"))
    }

    /// Where each `.nv.info` record of `attribute` in section `name` is.
    fn records(&self, name: &str, attribute: u8) -> Vec<usize> {
        let (start, size) = (self.data(name), self.size(name) as usize);
        let mut found = Vec::new();
        let mut at = start;
        while at < start + size {
            if self.b[at + 1] == attribute {
                found.push(at);
            }
            let value = if self.b[at] == 4 {
                usize::from(self.u16(at + 2))
            } else {
                0
            };
            at = (at + 4 + value + 3) & !3;
        }
        found
    }

    /// Where the first `.nv.info` record of `attribute` in section `name` is.
    fn record(&self, name: &str, attribute: u8) -> usize {
        *self
            .records(name, attribute)
            .first()
            .unwrap_or_else(|| panic!("no attribute {attribute:#x} in {name}"))
    }

    /// Where program header `n` is.
    fn program_header(&self, n: usize) -> usize {
        self.u64(32) as usize + 56 * n
    }
}

/// `real` with the header and links nvcc 13 writes: `EI_OSABI` 0x41, `EI_ABIVERSION` 8,
/// `e_version` 1, the SM number in bits 8-15 of `e_flags`, the sections holding symbol indexes
/// linked to `.symtab`, and every `sh_info` that is a section index flagged `SHF_INFO_LINK`.
fn nvcc13_style(real: &[u8]) -> Image {
    let mut image = Image::new(real);
    let sm = sm_arch(real).unwrap();
    image
        .set(7, &[0x41])
        .set(8, &[8])
        .set(20, &1u32.to_le_bytes())
        .set(48, &(0x0600_0004 | sm << 8).to_le_bytes());
    let symtab = image.index(".symtab") as u32;
    for i in 1..image.shnum() {
        let (header, name) = (image.header_of(i), image.name_of(i));
        let kind = image.u32(header + SH_TYPE);
        if matches!(kind, SHT_REL | SHT_RELA | SHT_CUDA_INFO) || name.starts_with(".text.") {
            image.set(header + SH_LINK, &symtab.to_le_bytes());
        }
        let info_is_a_section = matches!(kind, SHT_REL | SHT_RELA)
            || (kind == SHT_CUDA_INFO || name.starts_with(".nv.constant0."))
                && image.u32(header + SH_INFO) != 0;
        if info_is_a_section {
            let flags = image.u64(header + SH_FLAGS) | SHF_INFO_LINK;
            image.set(header + SH_FLAGS, &flags.to_le_bytes());
        }
    }
    image
}

#[test]
fn every_committed_blob_passes() {
    let mut embedded = 0;
    for model in MODELS {
        let cubins = CUBIN_ARCHS.iter().map(|&sm| {
            let blobs = cubin_for_model(model, sm).unwrap();
            for (name, blob) in blobs {
                assert_eq!(sm_arch(blob), Some(sm), "{model}/{name} for sm_{sm}");
            }
            blobs
        });
        for blobs in std::iter::once(ptx_for_model(model).unwrap()).chain(cubins) {
            for (name, blob) in blobs {
                check(blob).unwrap_or_else(|e| panic!("{model}/{name}: {e}"));
                embedded += 1;
            }
        }
    }
    assert_eq!(check(ELEMENTWISE_FATBIN), Ok(BlobKind::Fatbin));
    // 12 modules (4 demo, 1 each for model_a, model_b, faults, 3 launch, 2 hopper), as PTX and
    // for every architecture.
    assert_eq!(embedded, 12 * (1 + CUBIN_ARCHS.len()));

    // Straight from disk too, every file there: blobs added later are checked without a change
    // here, and a file of a kind this does not know fails it.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/gen");
    let (mut ptx, mut cubins, mut fatbins) = (0, 0, 0);
    for file in std::fs::read_dir(dir).unwrap() {
        let path = file.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let blob = std::fs::read(&path).unwrap();
        let expected = match path.extension().and_then(|e| e.to_str()) {
            // conditional.ptx has no NVRTC cubins (kernels/nvrtc.py, PTX_ONLY); its sm_90 cubin
            // comes from nvcc and is checked, not counted.
            Some("cubin") if name.starts_with("conditional.") => {
                assert_eq!(sm_arch(&blob), Some(90), "{name}");
                BlobKind::Cubin
            }
            Some("ptx") if name == "conditional.ptx" => BlobKind::Ptx,
            Some("ptx") => {
                ptx += 1;
                BlobKind::Ptx
            }
            Some("cubin") => {
                cubins += 1;
                // `NAME.sm_XY.cubin` holds SASS for sm_XY.
                let sm = name
                    .rsplit_once(".sm_")
                    .unwrap()
                    .1
                    .trim_end_matches(".cubin");
                assert_eq!(sm_arch(&blob), sm.parse().ok(), "{name}");
                BlobKind::Cubin
            }
            Some("fatbin") => {
                fatbins += 1;
                BlobKind::Fatbin
            }
            _ => {
                assert_eq!(
                    name, "NVRTC_VERSION",
                    "a file in kernels/gen/ of an unknown kind"
                );
                continue;
            }
        };
        assert_eq!(check(&blob), Ok(expected), "{name}");
    }
    assert!(ptx >= 7, "{ptx} PTX files");
    assert_eq!(
        cubins,
        ptx * CUBIN_ARCHS.len(),
        "a cubin per PTX file and architecture"
    );
    assert_eq!(fatbins, 1);
}

#[test]
fn the_sm_architecture_comes_from_e_flags_in_both_layouts() {
    for model in MODELS {
        for &sm in CUBIN_ARCHS {
            for (name, blob) in cubin_for_model(model, sm).unwrap() {
                // NVRTC 12.0: EI_ABIVERSION 7, the SM number in the low byte and in bits 16-23,
                // and CUDA 12.0's version, 120, in e_version.
                let image = Image::new(blob);
                assert_eq!((blob[8], image.u32(20)), (7, 120), "{model}/{name}");
                assert_eq!(image.u32(48), sm << 16 | 0x0500 | sm, "{model}/{name}");
                assert_eq!(sm_arch(blob), Some(sm), "{model}/{name} for sm_{sm}");
            }
        }
    }
    // The newer layout (nvcc 13): EI_ABIVERSION 8, the SM number in bits 8-15.
    let new = nvcc13_style(cubin("noop", 86));
    assert_eq!(new.u32(48), 0x0600_5604);
    assert_eq!(sm_arch(&new.b), Some(86));
    let mut later = Image::new(demo_cubin("noop"));
    later.set(8, &[9]);
    assert_eq!(
        sm_arch(&later.b),
        None,
        "an ABI version after the known ones"
    );
    let mut amd = Image::new(demo_cubin("noop"));
    amd.set(18, &224u16.to_le_bytes());
    assert_eq!(sm_arch(&amd.b), None);
    assert_eq!(sm_arch(ELEMENTWISE_FATBIN), None);
    assert_eq!(sm_arch(&demo_cubin("noop")[..40]), None);

    assert_eq!(code_targets(demo_cubin("noop")), "sm_90 SASS");
    assert_eq!(code_targets(cubin("noop", 75)), "sm_75 SASS");
    assert_eq!(code_targets(&amd.b), "an AMD GPU code object");
    assert_eq!(
        code_targets(ELEMENTWISE_FATBIN),
        "compute_75 PTX, sm_75 SASS, sm_80 SASS, sm_86 SASS, sm_89 SASS, sm_90 SASS"
    );
    assert_eq!(
        code_targets(ptx_for_model("demo").unwrap()[0].1),
        "compute_75 PTX (ISA 8.0)"
    );
    assert_eq!(
        code_targets(b".version 9.0\n"),
        "PTX (ISA 9.0) without a readable .target"
    );
    assert_eq!(code_targets(b"\xff\xfe"), "an unknown binary");
}

/// Both layouts in use pass: NVRTC 12.0's (committed) and nvcc 13's (header and links rewritten
/// the way nvcc 13 writes them), for every architecture.
#[test]
fn nvcc_13_style_cubins_pass_too() {
    for &sm in CUBIN_ARCHS {
        for (name, blob) in cubin_for_model("demo", sm).unwrap() {
            let nvcc = nvcc13_style(blob);
            assert_eq!(check(&nvcc.b), Ok(BlobKind::Cubin), "{name} for sm_{sm}");
            assert_eq!(sm_arch(&nvcc.b), Some(sm));
            // NVRTC 12.0 does not link these sections to the symbol table, nvcc 13 does.
            let real = Image::new(blob);
            let symtab = real.index(".symtab") as u32;
            assert_ne!(real.u32(real.field(".nv.info", SH_LINK)), symtab);
            assert_eq!(nvcc.u32(nvcc.field(".nv.info", SH_LINK)), symtab);
        }
    }
    // The object file version is the CUDA toolkit's in CUDA 12 cubins and 1 in nvcc 13's; no
    // reader locates anything by it, and none is refused.
    let real = Image::new(demo_cubin("elementwise"));
    for version in [0u32, 1, 115, 120, 128, 130, u32::MAX] {
        assert_passes(&real.with(20, &version.to_le_bytes()));
    }
    // `.nv.info` linked to nothing (0), as some cubins have it.
    assert_passes(&real.with_field(".nv.info", SH_LINK, &0u32.to_le_bytes()));
}

#[test]
fn ptx_is_nul_terminated_once() {
    let (_, owned) = prepare("m", b".version 8.0").unwrap();
    assert_eq!(&*owned, b".version 8.0\0");
    assert!(matches!(owned, Cow::Owned(_)));
    let (_, borrowed) = prepare("m", b".version 8.0\0").unwrap();
    assert!(matches!(borrowed, Cow::Borrowed(_)));
    for blob in [demo_cubin("noop"), ELEMENTWISE_FATBIN] {
        assert!(matches!(prepare("m", blob).unwrap().1, Cow::Borrowed(_)));
    }
}

#[test]
fn refusals_name_the_module_escaped() {
    let e = prepare("my\0mod", b"").unwrap_err().to_string();
    assert!(e.contains("my\\0mod") && e.contains("empty"), "{e}");
    let e = validate_blob("my_mod", b".version\0 8.0")
        .unwrap_err()
        .to_string();
    assert!(e.contains("my_mod") && e.contains("offset 8"), "{e}");
    assert!(matches!(
        validate_blob("m", b"\x7fELF"),
        Err(AtlasError::InvalidModule { .. })
    ));
}

/// Bytes of no format Atlas knows are refused, naming the formats it takes; loaded only through
/// the unsafe opt-in, they get a terminating NUL.
#[test]
fn other_formats_are_refused_or_get_a_terminating_nul() {
    for blob in [
        &[0xff, 0xfe][..],
        b"\x7fEL",
        b"// no PTX here\n",
        b"MZ\x90\0",
    ] {
        let e = prepare("m", blob).unwrap_err().to_string();
        assert!(
            e.contains("Atlas takes PTX, NVIDIA ELF cubins"),
            "{blob:?}: {e}"
        );
        let e = validate_blob("m", blob).unwrap_err().to_string();
        assert!(
            e.contains("no format Atlas knows") || e.contains("not PTX"),
            "{e}"
        );
    }
    let (kind, image) = super::prepare("m", &[0xff, 0xfe], true).unwrap();
    assert_eq!((kind, &*image), (BlobKind::Binary, &[0xff, 0xfe, 0][..]));
    let (kind, image) = super::prepare("m", b"not PTX", true).unwrap();
    assert_eq!((kind, &*image), (BlobKind::Binary, &b"not PTX\0"[..]));
    // Known formats are still checked on that path.
    let cubin = demo_cubin("noop");
    assert!(super::prepare("m", &cubin[..cubin.len() / 2], true).is_err());
    assert!(super::prepare("m", b".version 8.0\0x", true).is_err());
    assert!(super::prepare("m", b"", true).is_err());
    // 4 KiB of random bytes (a fixed seed): of no format.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    assert_eq!(sniff(&random), BlobKind::Binary);
    assert!(refusal(&random).contains("no format Atlas knows"));
}

#[test]
fn elf_header_fields_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let (len, shnum) = (real.len(), real.shnum());
    assert_refused(&real.b[..63], &["truncated", "64-byte header"]);
    assert_refused(&real.with(4, &[1]), &["64-bit"]);
    assert_refused(&real.with(5, &[2]), &["little-endian"]);
    assert_refused(
        &real.with(6, &[0]),
        &["identification version 0 (EI_VERSION)"],
    );
    assert_refused(&real.with(6, &[2]), &["identification version 2"]);
    assert_refused(
        &real.with(18, &62u16.to_le_bytes()),
        &["machine 62", "CUDA (190)"],
    );
    assert_refused(&real.with(16, &[9]), &["file type 9"]);
    assert_refused(&real.with(52, &[40]), &["e_ehsize is 40"]);
    assert_refused(&real.with(54, &[32]), &["e_phentsize is 32"]);
    assert_refused(&real.with(58, &[32]), &["e_shentsize is 32"]);
    // The section header table past the end, overlapping the header, or wrapping around.
    let past = format!("past the end of the {}-byte blob", Size(len as u64));
    assert_refused(
        &real.with(40, &(len as u64 - 64).to_le_bytes()),
        &[
            &format!("section header table ({shnum} entries)"),
            &past,
            "truncated",
        ],
    );
    assert_refused(
        &real.with(40, &8u64.to_le_bytes()),
        &["overlaps the ELF header"],
    );
    assert_refused(
        &real.with(40, &u64::MAX.to_le_bytes()),
        &["section header table"],
    );
    assert_refused(
        &real.with(60, &[200, 0]),
        &["section header table (200 entries)"],
    );
    assert_refused(&real.with(60, &[0, 0xff]), &["reserved range"]);
    assert_refused(&real.with(60, &[0, 0]), &["extended section numbering"]);
    assert_refused(
        &real.with(32, &(len as u64).to_le_bytes()),
        &["program header table"],
    );
    assert_refused(
        &real.with(56, &[0xff, 0xff]),
        &["extended program header numbering"],
    );
    assert_refused(
        &real.with(62, &(shnum as u16).to_le_bytes()),
        &[&format!(
            "e_shstrndx {shnum} is not one of the {shnum} sections"
        )],
    );
    assert_refused(&real.with(62, &[0, 0]), &["e_shstrndx 0"]);
    let symtab = real.index(".symtab");
    assert_refused(
        &real.with(62, &(symtab as u16).to_le_bytes()),
        &[&format!("section {symtab}"), "not a string table"],
    );
    // No section table at all: an ELF file, but not a cubin.
    let mut bare = Image::new(&real.with(40, &0u64.to_le_bytes()));
    bare.set(60, &[0, 0]);
    assert_refused(&bare.b, &["without a section header table"]);
}

#[test]
fn section_header_fields_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let (len, shnum) = (real.len() as u64, real.shnum());
    let broken = |name: &str, field: usize, bytes: &[u8]| real.with_field(name, field, bytes);
    // The example of the documentation: bytes past the end.
    let scale = real.label(".nv.info.scale");
    let size = real.size(".nv.info.scale");
    assert_refused(
        &broken(".nv.info.scale", SH_OFFSET, &4500u64.to_le_bytes()),
        &[&format!(
            "{scale}: offset 4500 + size {size} is past the end of the {}-byte blob (truncated \
             or corrupt)",
            Size(len)
        )],
    );
    let at = real.data(".nv.info.scale") as u64;
    assert_refused(
        &broken(".nv.info.scale", SH_SIZE, &(len - at + 1).to_le_bytes()),
        &[&scale, "past the end"],
    );
    assert_refused(
        &broken(".text.axpy", SH_SIZE, &u64::MAX.to_le_bytes()),
        &[&real.label(".text.axpy"), "past the end"],
    );
    // NOBITS sections have no bytes in the file: their offset and size point nowhere.
    let shared = Image::new(demo_cubin("block_reduce"));
    assert_passes(&shared.with_field(".nv.shared.block_sum", SH_SIZE, &(1u64 << 40).to_le_bytes()));
    let names = real.size(".shstrtab");
    assert_refused(
        &broken(".nv.info.scale", SH_NAME, &(names as u32).to_le_bytes()),
        &[&format!(
            "section {}: its name offset {names} is outside the {names}-byte section name table",
            real.index(".nv.info.scale")
        )],
    );
    let symtab = real.label(".symtab");
    assert_refused(
        &broken(".symtab", SH_LINK, &99u32.to_le_bytes()),
        &[&format!(
            "{symtab}: sh_link 99 is not one of the {shnum} sections"
        )],
    );
    assert_refused(
        &broken(
            ".symtab",
            SH_LINK,
            &(real.index(".symtab") as u32).to_le_bytes(),
        ),
        &[&format!(
            "{symtab}: links to {symtab}, which is not a string table"
        )],
    );
    // An sh_info that says it is a section index must be one.
    let mut flagged = real.clone();
    flagged.set(
        real.field(".nv.info.axpy", SH_FLAGS),
        &SHF_INFO_LINK.to_le_bytes(),
    );
    assert_passes(&flagged.b);
    assert_refused(
        &flagged.with_field(".nv.info.axpy", SH_INFO, &(shnum as u32).to_le_bytes()),
        &[
            &format!("{}: sh_info {shnum}", real.label(".nv.info.axpy")),
            "SHF_INFO_LINK",
        ],
    );
    // sh_info 0 flagged names no section: NVIDIA's assembler writes it, the driver loads it.
    assert_passes(&broken(".nv.info", SH_FLAGS, &SHF_INFO_LINK.to_le_bytes()));
    assert_refused(
        &flagged.with_field(".nv.info.axpy", SH_INFO, &u32::MAX.to_le_bytes()),
        &["sh_info 4294967295 is flagged as a section index (SHF_INFO_LINK)"],
    );
    // A kernel's constant bank names its code section, flagged or not (NVRTC 12.0 does not).
    let bank = real.label(".nv.constant0.scale");
    assert_eq!(
        real.u32(real.field(".nv.constant0.scale", SH_INFO)) as usize,
        real.index(".text.scale")
    );
    assert_refused(
        &broken(
            ".nv.constant0.scale",
            SH_INFO,
            &(shnum as u32).to_le_bytes(),
        ),
        &[&format!(
            "{bank}: sh_info {shnum} (the code section this belongs to) is not one of the \
             {shnum} sections"
        )],
    );
    assert_passes(&broken(".nv.constant0.scale", SH_INFO, &0u32.to_le_bytes()));
    let count = real.symbols();
    assert_refused(
        &broken(".symtab", SH_ENTSIZE, &16u64.to_le_bytes()),
        &[&format!("{symtab}: entry size 16"), "24-byte"],
    );
    assert_refused(
        &broken(".symtab", SH_SIZE, &(count * 24 - 1).to_le_bytes()),
        &["whole 24-byte entries"],
    );
    assert_refused(
        &broken(".symtab", SH_INFO, &(count as u32 + 1).to_le_bytes()),
        &[&format!(
            "sh_info {} (its first global symbol) is past its {count} symbols",
            count + 1
        )],
    );
    assert_refused(
        &broken(".symtab", SH_TYPE, &1u32.to_le_bytes()),
        &["without a symbol table"],
    );
    // A cubin has one symbol table, which every symbol index refers to.
    assert_refused(
        &broken(".debug_frame", SH_TYPE, &SHT_SYMTAB.to_le_bytes()),
        &[&format!(
            "{symtab} and {} are both symbol tables; a CUDA cubin has one",
            real.label(".debug_frame")
        )],
    );
    assert_refused(
        &broken(".text.axpy", SH_ALIGN, &96u64.to_le_bytes()),
        &["alignment 96 is not a power of two"],
    );
    assert_refused(
        &broken(
            ".strtab",
            SH_SIZE,
            &(real.size(".strtab") - 1).to_le_bytes(),
        ),
        &[&format!(
            "{}: the string table does not end with a NUL",
            real.label(".strtab")
        )],
    );
    assert_refused(
        &broken(".shstrtab", SH_SIZE, &(names - 1).to_le_bytes()),
        &["section name table", "does not end with a NUL"],
    );
    assert_refused(
        &real.with(real.header_of(0) + SH_TYPE, &1u32.to_le_bytes()),
        &["section 0 has a non-zero byte at offset 4 of its header"],
    );
    assert_refused(
        &broken(".nv.constant0.scale", SH_FLAGS, &0x802u64.to_le_bytes()),
        &[&format!("{bank}: flagged compressed (SHF_COMPRESSED)")],
    );
    // A section header with an unknown type and flags but sound offsets is not the checks' call.
    assert_passes(&broken(
        ".debug_frame",
        SH_TYPE,
        &0x6000_1234u32.to_le_bytes(),
    ));
}

#[test]
fn program_headers_are_checked() {
    for sm in [75, 90] {
        let real = Image::new(cubin("elementwise", sm));
        // The first loaded segment with bytes in the file.
        let n = (0..usize::from(real.u16(56)))
            .find(|&n| {
                let h = real.program_header(n);
                real.u32(h) == 1 && real.u64(h + 32) > 0
            })
            .unwrap();
        let h = real.program_header(n);
        assert_refused(
            &real.with(h + 8, &(real.len() as u64).to_le_bytes()),
            &[&format!("program header {n} (type 0x1)"), "past the end"],
        );
        // More bytes in the file than in memory: CUDA 11.0's ptxas writes it, the driver loads
        // it.
        assert_passes(&real.with(h + 40, &1u64.to_le_bytes()));
        assert_refused(
            &real.with(h + 32, &(real.len() as u64).to_le_bytes()),
            &[&format!("program header {n} (type 0x1)"), "past the end"],
        );
    }
}

#[test]
fn symbols_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let shnum = real.shnum();
    let axpy = real.symbol_named("axpy");
    let broken = |n: usize, field: usize, bytes: &[u8]| real.with(real.symbol(n) + field, bytes);
    let symtab = real.label(".symtab");
    let strings = real.size(".strtab");
    assert_refused(
        &broken(axpy, 0, &(strings as u32).to_le_bytes()),
        &[
            &format!("{symtab}: symbol {axpy}: its name offset {strings}"),
            &format!(
                "{}-byte string table {}",
                Size(strings),
                real.label(".strtab")
            ),
        ],
    );
    let named = format!("{symtab}: symbol {axpy} (axpy)");
    assert_refused(
        &broken(axpy, 6, &99u16.to_le_bytes()),
        &[&format!(
            "{named}: section index 99 is not one of the {shnum} sections"
        )],
    );
    assert_refused(
        &broken(axpy, 6, &0xff05u16.to_le_bytes()),
        &[&named, "0xff05 is reserved"],
    );
    assert_refused(&broken(axpy, 6, &0xffffu16.to_le_bytes()), &["SHN_XINDEX"]);
    // axpy is a function at 0 of its code section, as long as the section.
    let code = real.size(".text.axpy");
    assert_eq!(real.u64(real.symbol(axpy) + 16), code);
    assert_refused(
        &broken(axpy, 8, &16u64.to_le_bytes()),
        &[&format!(
            "{named}: value 16 + size {code} is past the end of {} ({code} bytes)",
            real.label(".text.axpy")
        )],
    );
    assert_refused(
        &broken(axpy, 16, &u64::MAX.to_le_bytes()),
        &[&format!("{named}: value 0")],
    );
    assert_refused(&broken(0, 0, &[1]), &["symbol 0 is not all zeros"]);
    assert_refused(
        &broken(axpy, 4, &[0x32]),
        &[&format!(
            "{named}: binding 3 and type 2 (st_info): one of them is reserved"
        )],
    );
    assert_refused(&broken(axpy, 4, &[0x18]), &["binding 1 and type 8"]);
    assert_passes(&broken(axpy, 4, &[0xd2]));
    // Undefined, absolute and common symbols are fine.
    for shndx in [0u16, 0xfff1, 0xfff2] {
        assert_passes(&broken(axpy, 6, &shndx.to_le_bytes()));
    }
}

/// The relocations of `name` in `image`: where each entry is.
fn relocation_entries(image: &Image, name: &str) -> Vec<usize> {
    let entry = image.u64(image.field(name, SH_ENTSIZE)) as usize;
    let start = image.data(name);
    (0..image.size(name) as usize / entry)
        .map(|n| start + n * entry)
        .collect()
}

#[test]
fn relocations_are_checked() {
    // sm_90: RELA; sm_75 to sm_89: REL. Either way the same checks.
    for (sm, table) in [(90, ".rela.debug_frame"), (86, ".rel.debug_frame")] {
        let real = Image::new(cubin("elementwise", sm));
        let count = real.symbols();
        let label = real.label(table);
        let first = relocation_entries(&real, table)[0];
        // R_CUDA_64 into .debug_frame.
        assert_eq!(real.u32(first + 8), 2);
        assert_refused(
            &real.with(first + 12, &(count as u32).to_le_bytes()),
            &[&format!(
                "{label}: relocation 0: symbol index {count} is past the {count} symbols of {}",
                real.label(".symtab")
            )],
        );
        let frame = real.size(".debug_frame");
        assert_refused(
            &real.with(first, &(frame - 7).to_le_bytes()),
            &[&format!(
                "relocation 0: offset {} + 8 bytes is past the end of {} ({frame} bytes)",
                frame - 7,
                real.label(".debug_frame")
            )],
        );
        assert_passes(&real.with(first, &(frame - 8).to_le_bytes()));
        assert_refused(
            &real.with(first + 8, &0x5000u32.to_le_bytes()),
            &["type 0x5000", "R_CUDA"],
        );
        assert_passes(&real.with(first + 8, &0x1_0001u32.to_le_bytes()));
        let field = |field, bytes: &[u8]| real.with_field(table, field, bytes);
        assert_refused(&field(SH_INFO, &0u32.to_le_bytes()), &["sh_info 0"]);
        // In a cubin, symbol indexes refer to the one symbol table whatever sh_link names
        // (NVRTC 12.0 names .nv.info), as long as it names a section.
        for link in [".nv.info", ".strtab", ".symtab"] {
            assert_passes(&field(SH_LINK, &(real.index(link) as u32).to_le_bytes()));
        }
        assert_refused(
            &field(SH_LINK, &(real.shnum() as u32).to_le_bytes()),
            &[&format!("{label}: sh_link {}", real.shnum())],
        );
        let (kind, entry, other, other_entry) = if sm == 90 {
            ("RELA", 24, SHT_REL, 16)
        } else {
            ("REL", 16, SHT_RELA, 24)
        };
        assert_refused(
            &field(SH_ENTSIZE, &(other_entry as u64).to_le_bytes()),
            &[
                &format!("entry size {other_entry}"),
                &format!("a {kind} table has whole {entry}-byte entries"),
            ],
        );
        assert_refused(
            &field(SH_TYPE, &other.to_le_bytes()),
            &[&format!("entry size {entry}"), "table has whole"],
        );
    }
}

/// How many bytes a relocation rewrites follows its type: a 128-bit instruction's whole 16
/// bytes, one byte of an address, 8 for the low 32 bits of one in an instruction's second word.
#[test]
fn relocations_rewrite_what_their_type_says() {
    let real = Image::new(demo_cubin("device_global"));
    let table = ".rela.text.add_bias";
    let first = relocation_entries(&real, table)[0];
    // R_CUDA_ABS32_LO_32 / _HI_32 into the code: the address of the global.
    assert!(matches!(real.u32(first + 8), 56 | 57));
    let code = real.size(".text.add_bias");
    let at_end = |offset: u64, rtype: u32| {
        let mut image = real.clone();
        image
            .set(first, &offset.to_le_bytes())
            .set(first + 8, &rtype.to_le_bytes());
        image.b
    };
    assert_passes(&at_end(code - 8, 56));
    assert_refused(
        &at_end(code - 4, 56),
        &[&format!(
            "offset {} + 8 bytes is past the end of {} ({code} bytes)",
            code - 4,
            real.label(".text.add_bias")
        )],
    );
    // R_CUDA_INSTRUCTION128 rewrites a whole 16-byte instruction.
    assert_passes(&at_end(code - 16, 67));
    assert_refused(&at_end(code - 8, 67), &["+ 16 bytes is past the end"]);
    // R_CUDA_8_0 rewrites one byte, R_CUDA_NONE none.
    assert_passes(&at_end(code - 1, 76));
    assert_passes(&at_end(code, 0));
    assert_refused(&at_end(code, 76), &["+ 1 bytes is past the end"]);
}

#[test]
fn nv_info_records_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let count = real.symbols();
    let axpy = real.label(".nv.info.axpy");
    let info = real.label(".nv.info");
    assert_refused(
        &real.with(real.data(".nv.info.axpy"), &[7]),
        &[&format!(
            "{axpy}: the attribute record at offset 0 has format 0x07"
        )],
    );
    // The first record of .nv.info.axpy is CUDA_API_VERSION, 4 bytes of value.
    let api = real.record(".nv.info.axpy", 0x37);
    assert_eq!((api, real.u32(api + 4)), (real.data(".nv.info.axpy"), 120));
    assert_refused(
        &real.with(api + 2, &0x100u16.to_le_bytes()),
        &[&format!(
            "record at offset 0 (attribute 0x37): its 256-byte value is past the end of the \
             {}-byte section",
            real.size(".nv.info.axpy")
        )],
    );
    // REGCOUNT in the global .nv.info: the first word is a symbol.
    let regcount = real.record(".nv.info", 0x2f);
    assert_eq!(regcount, real.data(".nv.info"));
    assert_refused(
        &real.with(regcount + 4, &(count as u32).to_le_bytes()),
        &[&format!(
            "{info}: the attribute record at offset 0 (attribute 0x2f): symbol index {count} is \
             past the {count} symbols"
        )],
    );
    for attribute in [0x11, 0x12, 0x23] {
        let at = real.record(".nv.info", attribute);
        assert_refused(
            &real.with(at + 4, &99u32.to_le_bytes()),
            &[&format!("(attribute {attribute:#04x}): symbol index 99")],
        );
    }
    // PARAM_CBANK: the symbol of the constant bank, and where in it the parameters are.
    let cbank = real.record(".nv.info.axpy", 0x0a);
    let symbol = real.u32(cbank + 4) as usize;
    let section = usize::from(real.u16(real.symbol(symbol) + 6));
    let bank = real.name_of(section);
    assert_eq!(bank, ".nv.constant0.axpy");
    let bank_size = real.size(&bank);
    let placement = real.u32(cbank + 8);
    let offset = u64::from(placement & 0xffff);
    let too_big = (bank_size - offset + 1) as u32;
    assert_refused(
        &real.with(cbank + 8, &(offset as u32 | too_big << 16).to_le_bytes()),
        &[&format!(
            "parameters at offset {offset} + size {too_big} are past the end of {} ({bank_size} \
             bytes)",
            real.label(&bank)
        )],
    );
    assert_refused(
        &real.with(cbank + 4, &40u32.to_le_bytes()),
        &["symbol index 40"],
    );
    // KPARAM_INFO: ordinal and placement within CBANK_PARAM_SIZE bytes.
    let params = real.records(".nv.info.axpy", 0x17);
    let bytes = real.u16(real.record(".nv.info.axpy", 0x19) + 2);
    let kparam = params[0];
    let ordinal = real.u16(kparam + 8);
    let size = real.u32(kparam + 12) >> 18;
    assert_refused(
        &real.with(kparam + 8, &(params.len() as u16).to_le_bytes()),
        &[&format!(
            "parameter ordinal {0}, but the kernel has {0} parameters",
            params.len()
        )],
    );
    let offset = bytes - size as u16 + 1;
    assert_refused(
        &real.with(kparam + 10, &offset.to_le_bytes()),
        &[&format!(
            "parameter {ordinal} at offset {offset} + size {size} is past the kernel's {bytes} \
             bytes of parameters"
        )],
    );
    // EXIT_INSTR_OFFSETS: inside the kernel's code.
    let exits = real.record(".nv.info.axpy", 0x1c);
    let code = real.size(".text.axpy");
    assert_refused(
        &real.with(exits + 4, &(code as u32).to_le_bytes()),
        &[&format!(
            "instruction offset {code} is past the end of {} ({code} bytes)",
            real.label(".text.axpy")
        )],
    );
    // .nv.compat (nvcc 13) has records of the same form.
    let mut compat = real.clone();
    compat.set(
        real.field(".nv.info.scale", SH_TYPE),
        &0x7000_0086u32.to_le_bytes(),
    );
    assert_passes(&compat.b);
    assert_refused(
        &compat.with(real.data(".nv.info.scale"), &[9]),
        &[&real.label(".nv.info.scale"), "format 0x09"],
    );
    // A truncated record header at the end of a section.
    let cut = real.size(".nv.info.scale") - 2;
    assert_refused(
        &real.with_field(".nv.info.scale", SH_SIZE, &cut.to_le_bytes()),
        &[
            &real.label(".nv.info.scale"),
            &format!("past the end of the {cut}-byte section"),
        ],
    );
}

/// nvcc 13's sm_90 cubin of `tests/fixtures/large_params.cu`: kernels whose parameters take more
/// than 4352 bytes, described by `KPARAM_INFO_V2` records, beside kernels described by
/// `KPARAM_INFO` records.
const LARGE_PARAMS_CUBIN: &[u8] =
    include_bytes!("../../../tests/fixtures/large_params.sm_90.cubin");

#[test]
fn large_parameter_records_are_checked() {
    let real = Image::new(LARGE_PARAMS_CUBIN);
    assert_passes(&real.b);
    // mixed(char, Small, short, Block, double, int*, long long): 7 records, the last parameter's
    // first, in 4840 bytes.
    let mixed = real.label(".nv.info.mixed");
    let params = real.records(".nv.info.mixed", 0x45);
    assert_eq!(params.len(), 7);
    assert!(real.records(".nv.info.mixed", 0x17).is_empty());
    let bytes = real.u16(real.record(".nv.info.mixed", 0x19) + 2);
    assert_eq!(bytes, 4840);
    let kparam = params[0];
    let (ordinal, size) = (real.u16(kparam + 8), real.u16(kparam + 12));
    assert_eq!((ordinal, real.u16(kparam + 10), size), (6, 4832, 8));
    let at = kparam - real.data(".nv.info.mixed");
    assert_refused(
        &real.with(kparam + 8, &7u16.to_le_bytes()),
        &[&format!(
            "{mixed}: the attribute record at offset {at} (attribute 0x45): parameter ordinal 7, \
             but the kernel has 7 parameters"
        )],
    );
    let offset = bytes - size + 1;
    assert_refused(
        &real.with(kparam + 10, &offset.to_le_bytes()),
        &[&format!(
            "(attribute 0x45): parameter 6 at offset {offset} + size 8 is past the kernel's \
             {bytes} bytes of parameters"
        )],
    );
    // A short record: 8 bytes of value hold no size.
    assert_refused(
        &real.with(kparam + 2, &8u16.to_le_bytes()),
        &["(attribute 0x45): 8 bytes, not the 12 of a parameter description"],
    );
    // The size is all 16 bits: largest(Largest, int) takes the most there may be, 32764 bytes,
    // 32760 of them its first parameter's; one more is past them.
    let largest = real.records(".nv.info.largest", 0x45);
    let first = largest[1];
    assert_eq!((real.u16(first + 8), real.u16(first + 12)), (0, 32760));
    assert_eq!(real.u16(real.record(".nv.info.largest", 0x19) + 2), 32764);
    assert_passes(&real.with(first + 12, &32764u16.to_le_bytes()));
    assert_refused(
        &real.with(first + 12, &32765u16.to_le_bytes()),
        &["parameter 0 at offset 0 + size 32765 is past the kernel's 32764 bytes of parameters"],
    );
    // The flags (the pointee's alignment and space) are the driver's to judge.
    assert_passes(&real.with(kparam + 14, &[0xff, 0xff]));
    // Both kinds in one kernel count as one list of parameters: parameter 6 described by a
    // KPARAM_INFO record (size in bits 18-31) passes, and is checked as one.
    let legacy = (8u32 << 18 | 0x1f000).to_le_bytes();
    let mut mix = real.clone();
    mix.set(kparam + 1, &[0x17]).set(kparam + 12, &legacy);
    assert_passes(&mix.b);
    assert_refused(
        &mix.with(kparam + 8, &7u16.to_le_bytes()),
        &["(attribute 0x17): parameter ordinal 7, but the kernel has 7 parameters"],
    );
    assert_refused(
        &mix.with(kparam + 10, &4833u16.to_le_bytes()),
        &["(attribute 0x17): parameter 6 at offset 4833 + size 8 is past the kernel's 4840"],
    );
}

#[test]
fn cuda_sections_linking_to_symbols_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let (count, shnum) = (real.symbols(), real.shnum());
    assert_refused(
        &real.with_field(".text.scale", SH_INFO, &(count as u32).to_le_bytes()),
        &[&format!(
            "{}: sh_info {count:#x} names symbol {count}, past the {count} symbols",
            real.label(".text.scale")
        )],
    );
    // NVRTC 12.0 keeps the register count in the high byte before sm_90.
    let older = Image::new(cubin("elementwise", 86));
    assert_ne!(older.u32(older.field(".text.scale", SH_INFO)) >> 24, 0);
    let symbol = real.u32(real.field(".text.scale", SH_INFO));
    assert_passes(&real.with_field(
        ".text.scale",
        SH_INFO,
        &(0x2000_0000 | symbol).to_le_bytes(),
    ));
    // Attribute sections may link to anything (NVRTC 12.0 links them to .nv.info itself), but to
    // a section.
    for link in [0, real.index(".strtab"), real.index(".symtab")] {
        assert_passes(&real.with_field(".nv.info", SH_LINK, &(link as u32).to_le_bytes()));
    }
    assert_refused(
        &real.with_field(".nv.info", SH_LINK, &(shnum as u32).to_le_bytes()),
        &[&format!("{}: sh_link {shnum}", real.label(".nv.info"))],
    );
    // The call graph (nvcc 13): pairs of caller and callee. A constant bank of zeros made one.
    let mut graph = real.clone();
    let bank = ".nv.constant0.scale";
    graph.set(real.field(bank, SH_TYPE), &0x7000_0001u32.to_le_bytes());
    assert!(real.b[real.data(bank)..][..16].iter().all(|&b| b == 0));
    assert_passes(&graph.b);
    assert_refused(
        &graph.with(real.data(bank) + 8, &(count as u32).to_le_bytes()),
        &[&format!(
            "{}: entry 1: symbol index {count} is past the {count} symbols",
            real.label(bank)
        )],
    );
    assert_passes(&graph.with(real.data(bank) + 8, &0xffff_fff1u32.to_le_bytes()));
    // Callees past the symbols: CUDA 11's cuFFT has them, and the driver loads it.
    assert_passes(&graph.with(real.data(bank) + 4, &(count as u32 + 48_000).to_le_bytes()));
    assert_refused(
        &graph.with(real.field(bank, SH_ENTSIZE), &4u64.to_le_bytes()),
        &["whole 8-byte entries"],
    );
}

#[test]
fn notes_are_checked() {
    // Two notes, the second filling what is left, in what was a constant bank of zeros (its size
    // kept: the kernel's parameters are in it).
    let mut real = Image::new(demo_cubin("elementwise"));
    let bank = ".nv.constant0.scale";
    let (label, note, size) = (real.label(bank), real.data(bank), real.size(bank));
    assert!(real.b[note..][..size as usize].iter().all(|&b| b == 0));
    real.set(real.field(bank, SH_TYPE), &SHT_NOTE.to_le_bytes())
        .set(note + 16, &(size as u32 - 24).to_le_bytes());
    assert_passes(&real.b);
    assert_refused(
        &real.with(note, &1000u32.to_le_bytes()),
        &[&format!(
            "{label}: the note at offset 0 runs past the end of the {size}-byte section"
        )],
    );
    assert_refused(
        &real.with(note + 16, &u32::MAX.to_le_bytes()),
        &[&format!("{label}: the note at offset 12 runs past the end")],
    );
}

/// The toolkit note of a cubin (`.note.nv.tkinfo`, nvcc 13 and NVRTC 13 write one): six words,
/// the note's version and five string offsets, then the strings. The driver follows the offsets
/// (it crashed on tool name offsets 0x9600_0001 and 0x0084_0001), so each must be a string inside
/// the note.
#[test]
fn toolkit_notes_are_checked() {
    let nvcc = fatbin_entries(NVCC13_FATBIN);
    let real = Image::new(payload(NVCC13_FATBIN, &nvcc[1]));
    let (label, note) = (real.label(".note.nv.tkinfo"), real.data(".note.nv.tkinfo"));
    // One note: "NVIDIA Corp" (12 bytes with its NUL), type 2000.
    assert_eq!((real.u32(note), real.u32(note + 8)), (12, 2000));
    let desc = note + 24;
    let strings = real.u32(note + 4) as usize - 24;
    let (tool_name, tool_options) = (desc + 8, desc + 20);
    let name = |field: usize| {
        let at = desc + 24 + real.u32(field) as usize;
        let end = at + real.b[at..].iter().position(|&c| c == 0).unwrap();
        String::from_utf8(real.b[at..end].to_vec()).unwrap()
    };
    assert_eq!(name(tool_name), "ptxas");
    assert!(
        name(tool_options).contains("sm_90"),
        "{}",
        name(tool_options)
    );
    assert_passes(&real.b);
    for (n, field) in [
        "object file name",
        "tool name",
        "tool version",
        "tool branch",
        "tool options",
    ]
    .iter()
    .enumerate()
    {
        let at = desc + 4 + 4 * n;
        for bad in [strings as u32, 0x9600_0001, u32::MAX] {
            assert_refused(
                &real.with(at, &bad.to_le_bytes()),
                &[&format!(
                    "{label}: the note at offset 0 is a toolkit note whose {field} offset \
                     {bad:#x} is not a NUL-terminated string inside its {strings} bytes of \
                     strings"
                )],
            );
        }
        // The last string's NUL: an empty string.
        assert_passes(&real.with(
            at,
            &(real.u32(tool_options) + name(tool_options).len() as u32).to_le_bytes(),
        ));
    }
    // Too short for its offsets.
    let mut short = real.clone();
    short.set(note + 4, &20u32.to_le_bytes());
    assert_refused(
        &short.b,
        &[&format!(
            "{label}: the note at offset 0 is a toolkit note of 20 bytes, shorter than the 24"
        )],
    );
    // In `.note.nv.tkinfo` a note of another type is read as the toolkit note; elsewhere, only
    // type 2000 is.
    assert_refused(
        &short.with(note + 8, &1000u32.to_le_bytes()),
        &["is a toolkit note of 20 bytes"],
    );
    let cuinfo = real.data(".note.nv.cuinfo");
    assert_eq!((real.u32(cuinfo + 4), real.u32(cuinfo + 8)), (8, 1000));
    assert_passes(&real.with(cuinfo + 24, &u64::MAX.to_le_bytes()));
    assert_refused(
        &real.with(cuinfo + 8, &2000u32.to_le_bytes()),
        &[&format!(
            "{}: the note at offset 0 is a toolkit note of 8 bytes",
            real.label(".note.nv.cuinfo")
        )],
    );
    // NVRTC 12.0's cubins have no notes.
    assert!(
        !(1..Image::new(demo_cubin("elementwise")).shnum()).any(|i| Image::new(demo_cubin(
            "elementwise"
        ))
        .name_of(i)
        .starts_with(".note"))
    );
}

/// The `.nv.info` records whose values hold what the driver follows (symbol indexes, the
/// parameters' place, instruction offsets) are sized records (format 4): the driver reads their
/// values whatever their format byte says, and crashed on a `SYSCALLS_FALLBACK` record of format
/// 3. Records of other attributes may have any format.
#[test]
fn nv_info_records_holding_indexes_are_sized() {
    let real = Image::new(demo_cubin("elementwise"));
    let count = real.symbols() as u32;
    let followed = [
        (".nv.info", 0x2f),
        (".nv.info", 0x11),
        (".nv.info", 0x12),
        (".nv.info", 0x23),
        (".nv.info.axpy", 0x0a),
        (".nv.info.axpy", 0x17),
        (".nv.info.axpy", 0x1c),
    ];
    for (section, attribute) in followed {
        let at = real.record(section, attribute);
        assert_eq!(real.b[at], 4, "{section} {attribute:#x}");
        for format in [1, 2, 3] {
            assert_refused(
                &real.with(at, &[format]),
                &[&format!(
                    "{}: the attribute record at offset {} (attribute {attribute:#04x}): a \
                     record of format {format} (",
                    real.label(section),
                    at - real.data(section)
                )],
            );
        }
    }
    // MAXREG_COUNT is a half word the driver does not follow: any format.
    let maxreg = real.record(".nv.info.axpy", 0x1b);
    assert_eq!(real.b[maxreg], 3);
    assert_passes(&real.with(maxreg, &[2]));
    // REGCOUNT's record (a symbol index and a count) as the other attributes whose first word is a
    // symbol index, as cuobjdump reads them: LOAD_CACHE_REQUEST (0x26), SAM_REGION_STACK_SIZE
    // (0x3b).
    let regcount = real.record(".nv.info", 0x2f);
    for attribute in [0x26, 0x3b] {
        let record = real.with(regcount + 1, &[attribute]);
        assert_passes(&record);
        assert_refused(
            &Image::new(&record).with(regcount + 4, &count.to_le_bytes()),
            &[&format!(
                "(attribute {attribute:#04x}): symbol index {count} is past"
            )],
        );
    }
    // SYSCALLS_FALLBACK (0x5d): pairs of symbol indexes, a syscall and its fallback.
    let fallback = real.with(regcount + 1, &[0x5d]);
    let fallback = Image::new(&fallback);
    assert_passes(&fallback.with(regcount + 4, &[1, 0, 0, 0, 2, 0, 0, 0]));
    for word in [regcount + 4, regcount + 8] {
        assert_refused(
            &fallback.with(word, &count.to_le_bytes()),
            &[&format!("(attribute 0x5d): symbol index {count} is past")],
        );
    }
    let kparam = real.record(".nv.info.axpy", 0x17);
    assert_refused(
        &real.with(kparam + 1, &[0x5d]),
        &["(attribute 0x5d): 12 bytes, not whole pairs of symbol indexes (8 bytes each)"],
    );
}

/// AMD GPU code objects get the generic checks only, and are not refused for their machine.
#[test]
fn amd_gpu_elf_gets_the_generic_checks() {
    // An AMD code object links its relocations to its symbol table and has e_version 1.
    let mut amd = nvcc13_style(demo_cubin("elementwise"));
    amd.set(18, &224u16.to_le_bytes());
    assert_eq!(check(&amd.b), Ok(BlobKind::Cubin));
    // Its object file version is the driver's to judge, as a cubin's is.
    assert_eq!(
        check(&amd.with(20, &120u32.to_le_bytes())),
        Ok(BlobKind::Cubin)
    );
    // NVIDIA's records and sections are not AMD's business...
    assert_eq!(
        check(&amd.with(amd.data(".nv.info.axpy"), &[7])),
        Ok(BlobKind::Cubin)
    );
    let count = amd.symbols() as u32;
    assert_eq!(
        check(&amd.with_field(".text.scale", SH_INFO, &count.to_le_bytes())),
        Ok(BlobKind::Cubin)
    );
    // ...but every generic link, offset and index is: relocations name their symbol table.
    assert_refused(
        &amd.with_field(".symtab", SH_LINK, &99u32.to_le_bytes()),
        &["sh_link 99"],
    );
    let info = amd.index(".nv.info") as u32;
    assert_refused(
        &amd.with_field(".rela.debug_frame", SH_LINK, &info.to_le_bytes()),
        &[&format!(
            "links to {}, which is not a symbol table",
            amd.label(".nv.info")
        )],
    );
    // Inside a fatbin only NVIDIA's ELF belongs.
    assert_refused(
        &with_fatbin_elf(&amd.b),
        &["machine 224 (AMD GPU) inside an NVIDIA fatbin"],
    );
}

/// A big real ELF file, this test binary (dynamic symbols, dynamic relocations, hash tables,
/// version tables, notes, debug sections), passes the generic checks when relabelled for an AMD
/// GPU: they refuse only what is malformed.
#[test]
fn a_real_shared_object_passes_the_generic_checks() {
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert!(
        exe.starts_with(b"\x7fELF") && exe[4] == 2 && exe[5] == 1,
        "a 64-bit LE ELF host"
    );
    let mut amd = exe.clone();
    amd[18..20].copy_from_slice(&224u16.to_le_bytes());
    assert_eq!(check(&amd), Ok(BlobKind::Cubin));
    assert_refused(
        &exe,
        &[&format!(
            "machine {}",
            u16::from_le_bytes([exe[18], exe[19]])
        )],
    );
}

/// A fatbin entry, as read from its header.
#[derive(Debug, Clone, Copy)]
struct FatEntry {
    at: usize,
    header: usize,
    payload: usize,
    kind: u16,
    arch: u32,
}

impl FatEntry {
    fn payload_at(&self) -> usize {
        self.at + self.header
    }
}

/// The entries of fatbin `b`.
fn fatbin_entries(b: &[u8]) -> Vec<FatEntry> {
    let image = Image::new(b);
    let end = usize::from(image.u16(6)) + image.u64(8) as usize;
    let mut at = usize::from(image.u16(6));
    let mut entries = Vec::new();
    while at < end {
        let entry = FatEntry {
            at,
            header: image.u32(at + 4) as usize,
            payload: image.u64(at + 8) as usize,
            kind: image.u16(at),
            arch: image.u32(at + 28),
        };
        entries.push(entry);
        at += entry.header + entry.payload;
    }
    entries
}

/// The committed fatbin's entry for `sm` SASS.
fn fatbin_elf_entry(sm: u32) -> (usize, FatEntry) {
    fatbin_entries(ELEMENTWISE_FATBIN)
        .into_iter()
        .enumerate()
        .find(|(_, e)| e.kind == 2 && e.arch == sm)
        .unwrap()
}

/// The committed fatbin with `elf` (the size of the sm_90 cubin) as its sm_90 entry's payload.
fn with_fatbin_elf(elf: &[u8]) -> Vec<u8> {
    let (_, entry) = fatbin_elf_entry(90);
    let mut b = ELEMENTWISE_FATBIN.to_vec();
    assert_eq!(entry.payload, elf.len());
    b[entry.payload_at()..][..entry.payload].copy_from_slice(elf);
    b
}

/// A zstd frame holding `content` in one raw (stored) block: what a compressor writes for data
/// it cannot shrink, and valid for every zstd decoder (RFC 8878, 3.1.1).
fn zstd_frame(content: &[u8]) -> Vec<u8> {
    assert!((256..65536 + 256).contains(&content.len()));
    let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd];
    // Single segment, a 2-byte content size (stored less 256), no checksum, no dictionary.
    frame.push(0x60);
    frame.extend_from_slice(&(content.len() as u16 - 256).to_le_bytes());
    // The last block, raw, of content.len() bytes.
    let block = 1 | (content.len() as u32) << 3;
    frame.extend_from_slice(&block.to_le_bytes()[..3]);
    frame.extend_from_slice(content);
    frame
}

/// The committed fatbin's PTX entry alone, zstd-compressed as nvcc stores it by default.
fn zstd_ptx_fatbin() -> Vec<u8> {
    let entry = fatbin_entries(ELEMENTWISE_FATBIN)[0];
    assert_eq!(entry.kind, 1);
    let ptx = &ELEMENTWISE_FATBIN[entry.payload_at()..][..entry.payload];
    let text = &ptx[..ptx.iter().position(|&c| c == 0).unwrap() + 1];
    let frame = zstd_frame(text);
    let payload = frame.len().div_ceil(8) * 8;
    let mut header = ELEMENTWISE_FATBIN[entry.at..entry.payload_at()].to_vec();
    header[8..16].copy_from_slice(&(payload as u64).to_le_bytes());
    header[16..20].copy_from_slice(&(frame.len() as u32).to_le_bytes());
    header[40..48].copy_from_slice(&0x8011u64.to_le_bytes());
    header[56..64].copy_from_slice(&(text.len() as u64).to_le_bytes());
    let mut b = ELEMENTWISE_FATBIN[..16].to_vec();
    b[8..16].copy_from_slice(&((header.len() + payload) as u64).to_le_bytes());
    b.extend_from_slice(&header);
    b.extend_from_slice(&frame);
    b.resize(16 + header.len() + payload, 0);
    b
}

#[test]
fn fatbin_entries_are_checked() {
    let real = Image::new(ELEMENTWISE_FATBIN);
    let entries = fatbin_entries(&real.b);
    // The PTX (plain, 80-byte header, NUL-terminated), then the cubin of every architecture.
    let ptx = entries[0];
    assert_eq!((ptx.at, ptx.kind, ptx.header, ptx.arch), (16, 1, 80, 75));
    let text = ptx_for_model("demo").unwrap()[1];
    assert_eq!(text.0, "elementwise");
    assert!(real.b[ptx.payload_at()..].starts_with(text.1));
    assert_eq!(entries.len(), 1 + CUBIN_ARCHS.len());
    for (entry, &sm) in entries[1..].iter().zip(CUBIN_ARCHS) {
        assert_eq!((entry.kind, entry.header, entry.arch), (2, 64, sm));
        assert_eq!(
            &real.b[entry.payload_at()..][..entry.payload],
            cubin("elementwise", sm)
        );
    }
    let (index, elf) = fatbin_elf_entry(90);
    let at = elf.at;
    assert_refused(&real.with(4, &[2]), &["fatbin version 2"]);
    assert_refused(&real.with(8, &0u64.to_le_bytes()), &["no entries"]);
    assert_refused(&real.b[..real.len() - 1], &["truncated fatbin"]);
    // A kind Atlas does not know is the driver's to judge (NVIDIA's libraries hold kind 8).
    assert_eq!(check(&real.with(at, &[7])), Ok(BlobKind::Fatbin));
    assert_refused(
        &real.with(at + 4, &[32]),
        &[
            &format!("malformed fatbin: fatbin entry {index}"),
            "32-byte header",
        ],
    );
    assert_refused(
        &real.with(at + 8, &(elf.payload as u64 + 1).to_le_bytes()),
        &[
            "malformed fatbin",
            &format!("{}-byte payload", elf.payload + 1),
        ],
    );
    assert_refused(
        &real.with(at + 32, &[0x70, 0x17, 0, 0, 8]),
        &[
            "its name at offset 6000 + size 8 (at 32) is not a NUL-terminated string inside its \
           64-byte header",
        ],
    );
    // The ELF inside is checked as a cubin, and refusals say where it is.
    let mut cubin = Image::new(demo_cubin("elementwise"));
    cubin.set(cubin.field(".symtab", SH_LINK), &99u32.to_le_bytes());
    assert_refused(
        &with_fatbin_elf(&cubin.b),
        &[&format!(
            "fatbin entry {index} (ELF sm_90 at offset {at}): {}: sh_link 99",
            cubin.label(".symtab")
        )],
    );
    let cubin = Image::new(demo_cubin("elementwise"));
    assert_refused(
        &with_fatbin_elf(&cubin.with_field(".nv.info.scale", SH_OFFSET, &4500u64.to_le_bytes())),
        &[&format!(
            "past the end of the {}-byte ELF payload",
            Size(elf.payload as u64)
        )],
    );
}

#[test]
fn uncompressed_ptx_entries_must_end_inside_the_payload() {
    let entry = fatbin_entries(ELEMENTWISE_FATBIN)[0];
    let mut b = ELEMENTWISE_FATBIN.to_vec();
    let payload = &mut b[entry.payload_at()..][..entry.payload];
    assert_eq!(payload.last(), Some(&0));
    for byte in payload.iter_mut().filter(|b| **b == 0) {
        *byte = b' ';
    }
    assert_refused(
        &b,
        &[&format!(
            "fatbin entry 0 (PTX sm_75 at offset 16): the {}-byte PTX payload has no terminating \
             NUL",
            Size(entry.payload as u64)
        )],
    );
}

/// Compressed entries are decompressed, and what comes out is checked as an uncompressed entry's
/// payload would be.
#[test]
fn compressed_fatbin_entries_are_checked_inside() {
    let good = Image::new(&zstd_ptx_fatbin());
    assert_eq!(check(&good.b), Ok(BlobKind::Fatbin));
    assert_eq!(code_targets(&good.b), "compute_75 PTX");
    let entry = fatbin_entries(&good.b)[0];
    let (at, payload) = (entry.at, entry.payload as u64);
    let compressed = u64::from(good.u32(at + 16));
    let plain = good.u64(at + 56);
    assert_refused(
        &good.with(at + 16, &0u32.to_le_bytes()),
        &["fatbin entry 0 (PTX sm_75 at offset 16, zstd-compressed): compressed size 0"],
    );
    assert_refused(
        &good.with(at + 16, &(payload as u32 + 1).to_le_bytes()),
        &[&format!(
            "compressed size {} does not fit the {}-byte payload",
            payload + 1,
            Size(payload)
        )],
    );
    assert_refused(
        &good.with(at + 8, &(compressed - 8).to_le_bytes()),
        &["does not fit"],
    );
    assert_refused(
        &good.with(at + 56, &0u64.to_le_bytes()),
        &["no uncompressed size"],
    );
    // The stream decompresses to what it holds, not to what the entry declares.
    assert_refused(
        &good.with(at + 56, &(plain + 1).to_le_bytes()),
        &[&format!(
            "decompress to {} bytes, it declares {}",
            Size(plain),
            Size(plain + 1)
        )],
    );
    assert_refused(
        &good.with(at + 56, &(plain - 1).to_le_bytes()),
        &[&format!(
            "do not decompress to the {} bytes it declares",
            Size(plain - 1)
        )],
    );
    assert_refused(
        &good.with(entry.payload_at(), &[0]),
        &["zstd-compressed bytes do not decompress"],
    );
    // Trailing bytes inside the compressed size are more of the stream, which is then broken.
    let mut trailing = good.clone();
    trailing.set(at + 16, &(compressed as u32 + 1).to_le_bytes());
    trailing.set(entry.payload_at() + compressed as usize, &[0x42]);
    assert_refused(&trailing.b, &["do not decompress"]);
    // Two compressions, or one Atlas cannot read: the code the driver reads cannot be checked.
    assert_refused(
        &good.with(at + 41, &[0xa0]),
        &["flags 0xa011 name a compression Atlas cannot read"],
    );
    assert_refused(&good.with(at + 41, &[0x10]), &["flags 0x1011"]);
    // LZ4 is read as LZ4: a zstd stream is not one.
    assert_refused(&good.with(at + 41, &[0x20]), &["LZ4-compressed bytes"]);
    // What comes out is checked as PTX: no NUL at its end, or not PTX.
    // After the frame header (7 bytes) and the raw block's (3).
    let text_at = entry.payload_at() + 10;
    assert_eq!(&good.b[text_at..text_at + 2], b"//");
    assert_refused(
        &good.with(text_at, b"xx"),
        &["does not start with a `.version` directive"],
    );
    let last = text_at + plain as usize - 1;
    assert_eq!(good.b[last], 0);
    assert_refused(&good.with(last, b"x"), &["has no terminating NUL"]);
}

/// nvcc 13.0's fatbins of `kernels/elementwise.cu` for sm_90 with `-compress-mode=speed
/// -Xfatbin=-compress-all` (PTX and cubin in NVIDIA's LZ4 format) and `-compress-mode=size`
/// (both zstd); see `testdata/make.py`.
const NVCC13_LZ4_FATBIN: &[u8] = include_bytes!("testdata/nvcc13.0.elementwise.lz4.fatbin");
const NVCC13_ZSTD_FATBIN: &[u8] = include_bytes!("testdata/nvcc13.0.elementwise.zstd.fatbin");

/// A fatbin of one entry: `code` of `kind` for `arch`, stored plain (flags 0x11), or as
/// `compressed` (flags `flags`) of `code`.
fn one_entry_fatbin(
    kind: u16,
    arch: u32,
    code: &[u8],
    compressed: Option<(u64, &[u8])>,
) -> Vec<u8> {
    let (flags, stored) = compressed.unwrap_or((0x11, code));
    let payload = stored.len().div_ceil(8) * 8;
    let mut header = vec![0u8; 64];
    header[0..2].copy_from_slice(&kind.to_le_bytes());
    header[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
    header[4..8].copy_from_slice(&64u32.to_le_bytes());
    header[8..16].copy_from_slice(&(payload as u64).to_le_bytes());
    header[28..32].copy_from_slice(&arch.to_le_bytes());
    header[40..48].copy_from_slice(&flags.to_le_bytes());
    if compressed.is_some() {
        header[16..20].copy_from_slice(&(stored.len() as u32).to_le_bytes());
        header[56..64].copy_from_slice(&(code.len() as u64).to_le_bytes());
    }
    let mut b = fatbin::MAGIC.to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(&((64 + payload) as u64).to_le_bytes());
    b.extend_from_slice(&header);
    b.extend_from_slice(stored);
    b.resize(16 + 64 + payload, 0);
    b
}

/// What `check` says of a one-entry fatbin of `cubin`, after its entry's label.
fn verdict(fatbin: &[u8]) -> std::result::Result<BlobKind, String> {
    check(fatbin).map_err(|e| {
        e.split_once("): ")
            .map_or(e.clone(), |(_, why)| why.to_owned())
    })
}

/// The demo's sm_90 cubin with one field of one section header changed, for every field that a
/// reader follows and every section: the mutants the driver crashed on when they were compressed.
fn section_header_mutants() -> Vec<(String, Vec<u8>)> {
    let cubin = Image::new(demo_cubin("elementwise"));
    let mut mutants = Vec::new();
    for index in 1..cubin.shnum() {
        let name = cubin.name_of(index);
        let header = cubin.header_of(index);
        for (field, value) in [
            (SH_NAME, u32::MAX as u64),
            (SH_TYPE, 2),
            (SH_OFFSET, 4500),
            (SH_SIZE, 1 << 20),
            (SH_LINK, 99),
            (SH_INFO, 99),
            (SH_ENTSIZE, 7),
        ] {
            let width = if matches!(field, SH_NAME | SH_TYPE | SH_LINK | SH_INFO) {
                4
            } else {
                8
            };
            let bytes = value.to_le_bytes();
            mutants.push((
                format!("section {index} ({name}) field at {field}"),
                cubin.with(header + field, &bytes[..width]),
            ));
        }
    }
    mutants
}

/// An entry stored compressed gets the verdict its uncompressed twin gets: the same refusal, or
/// none. (On an H200, 27 of 86 such mutants compressed as LZ4 crashed the driver, while Atlas
/// checked only the container and let all of them through.)
#[test]
fn compressed_entries_get_the_verdict_of_their_uncompressed_twins() {
    let (mut refused, mut passed) = (0, 0);
    let original = ("unchanged".to_owned(), demo_cubin("elementwise").to_vec());
    for (what, cubin) in std::iter::once(original).chain(section_header_mutants()) {
        let plain = verdict(&one_entry_fatbin(2, 90, &cubin, None));
        let lz4 = compressed::tests::lz4_literals(&cubin);
        let zstd = zstd_frame(&cubin);
        for (scheme, flags, stream) in [("LZ4", 0x2011, &lz4), ("zstd", 0x8011, &zstd)] {
            let twin = verdict(&one_entry_fatbin(2, 90, &cubin, Some((flags, stream))));
            assert_eq!(twin, plain, "{what}, {scheme}");
        }
        match plain {
            Ok(_) => passed += 1,
            Err(_) => refused += 1,
        }
    }
    // Most single-field changes of a section header are refused; some (a string table's
    // `sh_entsize`, links of sections that link to nothing) are harmless.
    assert!(
        refused > 60 && passed > 1,
        "{refused} refused, {passed} passed"
    );
}

#[test]
fn nvcc_13_compressed_fatbins_pass_and_decompress_to_their_cubins() {
    for fatbin in [NVCC13_LZ4_FATBIN, NVCC13_ZSTD_FATBIN, NVCC13_FATBIN] {
        assert_eq!(check(fatbin), Ok(BlobKind::Fatbin));
        assert_eq!(
            super::validate_blob_for_device("m", fatbin, (9, 0)).unwrap(),
            BlobKind::Fatbin
        );
    }
    // Both compressions decompress to nvcc's cubin, which the uncompressed fatbin holds as it is.
    let cubin_of = |fatbin| {
        let mut cubin = None;
        fatbin::check_picked(fatbin, Some(Devices::Sm(90)), |code, bytes, _| {
            if code == crate::code::target::Code::Sass(crate::code::target::Arch::baseline(90)) {
                cubin = Some(bytes.to_vec());
            }
        })
        .unwrap();
        cubin.unwrap()
    };
    let plain = cubin_of(NVCC13_FATBIN);
    assert_eq!(cubin_of(NVCC13_LZ4_FATBIN), plain);
    assert_eq!(cubin_of(NVCC13_ZSTD_FATBIN), plain);
    // One byte of a section header inside each: refused as the plain cubin with it is.
    let shoff = u64::from_le_bytes(plain[40..48].try_into().unwrap()) as usize;
    let link_of_symtab = shoff + 3 * 64 + SH_LINK;
    for (label, fatbin) in [("LZ4", NVCC13_LZ4_FATBIN), ("zstd", NVCC13_ZSTD_FATBIN)] {
        let mut cubin = plain.clone();
        cubin[link_of_symtab] = 99;
        let plain_verdict = verdict(&one_entry_fatbin(2, 90, &cubin, None));
        assert!(plain_verdict.is_err(), "{label}");
        let zstd = zstd_frame(&cubin);
        let lz4 = compressed::tests::lz4_literals(&cubin);
        let (flags, stream) = if label == "LZ4" {
            (0x2011, &lz4)
        } else {
            (0x8011, &zstd)
        };
        let _ = fatbin;
        assert_eq!(
            verdict(&one_entry_fatbin(2, 90, &cubin, Some((flags, stream)))),
            plain_verdict
        );
    }
}

/// A clang offload bundle: a host entry with no code, and `code` for sm_90.
fn bundle(code: &[u8]) -> Vec<u8> {
    let ids: [&[u8]; 2] = [
        b"host-x86_64-unknown-linux-gnu-",
        b"cuda-nvptx64-nvidia-cuda-sm_90",
    ];
    let table = 24 + 8 + ids.iter().map(|id| 24 + id.len()).sum::<usize>();
    let mut b = bundle::MAGIC.to_vec();
    b.extend_from_slice(&2u64.to_le_bytes());
    for (id, (offset, size)) in ids.iter().zip([(table, 0), (table, code.len())]) {
        b.extend_from_slice(&(offset as u64).to_le_bytes());
        b.extend_from_slice(&(size as u64).to_le_bytes());
        b.extend_from_slice(&(id.len() as u64).to_le_bytes());
        b.extend_from_slice(id);
    }
    b.extend_from_slice(code);
    b
}

#[test]
fn offload_bundles_are_checked() {
    let cubin = demo_cubin("elementwise");
    let good = bundle(cubin);
    assert_eq!(check(&good), Ok(BlobKind::OffloadBundle));
    assert!(matches!(prepare("m", &good).unwrap().1, Cow::Borrowed(_)));
    let mut amd = nvcc13_style(cubin);
    amd.set(18, &224u16.to_le_bytes());
    assert_eq!(check(&bundle(&amd.b)), Ok(BlobKind::OffloadBundle));
    // Non-ELF code objects (bitcode, PTX) go to the driver as they are.
    assert_eq!(check(&bundle(b"BC\xc0\xde")), Ok(BlobKind::OffloadBundle));

    let bad = Image::new(cubin);
    assert_refused(
        &bundle(&bad.with_field(".symtab", SH_LINK, &99u32.to_le_bytes())),
        &[&format!(
            "offload bundle entry 1 (cuda-nvptx64-nvidia-cuda-sm_90): {}: sh_link 99",
            bad.label(".symtab")
        )],
    );
    let second = 32 + 24 + 30;
    let broken = |at: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    assert_refused(
        &broken(second + 8, &(cubin.len() as u64 + 1).to_le_bytes()),
        &[
            "offload bundle entry 1 (cuda-nvptx64-nvidia-cuda-sm_90): offset",
            "past the end",
        ],
    );
    assert_refused(&broken(second, &u64::MAX.to_le_bytes()), &["past the end"]);
    assert_refused(
        &broken(second + 16, &(good.len() as u64).to_le_bytes()),
        &["entry 1: its id", "past the end"],
    );
    let long = refusal(&broken(second + 16, &1000u64.to_le_bytes()));
    assert!(
        long.contains("its 1,000-byte id") && long.len() < 300,
        "{long}"
    );
    assert_refused(
        &broken(second + 24, b" "),
        &["entry 1: its 30-byte id", "not a target name"],
    );
    assert_refused(
        &broken(second + 16, &0u64.to_le_bytes()),
        &["not a target name"],
    );
    assert_refused(&broken(24, &0u64.to_le_bytes()), &["no entries"]);
    assert_refused(&broken(24, &u64::MAX.to_le_bytes()), &["do not fit"]);
    assert_refused(&good[..28], &["too short for its entry count"]);
}

/// A compressed offload bundle (`CCOB`) of version `version` holding `plain` as one zstd frame.
fn compressed_bundle(version: u16, method: u16, plain: &[u8]) -> Vec<u8> {
    let frame = zstd_frame(plain);
    let mut b = b"CCOB".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&method.to_le_bytes());
    let header = match version {
        1 => 20,
        2 => 24,
        _ => 32,
    };
    let total = (header + frame.len()) as u64;
    match version {
        1 => b.extend_from_slice(&(plain.len() as u32).to_le_bytes()),
        2 => {
            b.extend_from_slice(&(total as u32).to_le_bytes());
            b.extend_from_slice(&(plain.len() as u32).to_le_bytes());
        }
        _ => {
            b.extend_from_slice(&total.to_le_bytes());
            b.extend_from_slice(&(plain.len() as u64).to_le_bytes());
        }
    }
    b.extend_from_slice(&0x1234_5678u64.to_le_bytes()); // the hash, which nothing reads
    b.extend_from_slice(&frame);
    b
}

#[test]
fn compressed_offload_bundles_are_checked_inside() {
    let cubin = demo_cubin("elementwise");
    let plain = bundle(cubin);
    for version in [1, 2, 3] {
        let good = compressed_bundle(version, 1, &plain);
        assert_eq!(sniff(&good), BlobKind::OffloadBundle);
        assert_eq!(
            check(&good),
            Ok(BlobKind::OffloadBundle),
            "version {version}"
        );
        // Trailing bytes after the bundle are not its.
        let mut longer = good.clone();
        longer.extend_from_slice(b"more");
        if version > 1 {
            assert_eq!(
                check(&longer),
                Ok(BlobKind::OffloadBundle),
                "version {version}"
            );
        }
    }
    // What it decompresses to is checked as a plain bundle.
    let broken = Image::new(cubin).with_field(".symtab", SH_LINK, &99u32.to_le_bytes());
    assert_refused(
        &compressed_bundle(2, 1, &bundle(&broken)),
        &[
            "in the compressed offload bundle: offload bundle entry 1",
            "sh_link 99",
        ],
    );
    assert_refused(
        &compressed_bundle(2, 1, &cubin[..300]),
        &["does not decompress to an offload bundle"],
    );
    assert_refused(
        &compressed_bundle(2, 0, &plain),
        &["a zlib-compressed offload bundle"],
    );
    assert_refused(&compressed_bundle(2, 7, &plain), &["method 7"]);
    assert_refused(
        &compressed_bundle(4, 1, &plain),
        &["version 4; Atlas reads versions 1 to 3"],
    );
    let good = compressed_bundle(2, 1, &plain);
    assert_refused(
        &good[..good.len() - 1],
        &["truncated compressed offload bundle"],
    );
    assert_refused(&good[..10], &["truncated compressed offload bundle"]);
    let mut wrong_size = good.clone();
    wrong_size[12..16].copy_from_slice(&(plain.len() as u32 + 1).to_le_bytes());
    assert_refused(&wrong_size, &["decompress to"]);
}

/// A bundle's host entry may hold the host's object file: not the driver's code, not checked.
#[test]
fn host_objects_in_bundles_are_not_the_drivers() {
    let mut x86 = Image::new(demo_cubin("noop"));
    x86.set(18, &62u16.to_le_bytes());
    x86.set(40, &u64::MAX.to_le_bytes());
    assert_eq!(check(&bundle(&x86.b)), Ok(BlobKind::OffloadBundle));
}

/// Real compressed entries with any one byte of their streams changed: decompression and the
/// checks of what comes out refuse or pass, and never panic. (A panic fails this test.)
#[test]
fn changed_compressed_streams_never_panic() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut passed, mut refused) = (0, 0);
    for fatbin in [NVCC13_LZ4_FATBIN, NVCC13_ZSTD_FATBIN, NVCC13_FATBIN] {
        let streams: Vec<(usize, usize)> = fatbin_entries(fatbin)
            .iter()
            .filter(|e| Image::new(fatbin).u32(e.at + 16) != 0)
            .map(|e| (e.payload_at(), Image::new(fatbin).u32(e.at + 16) as usize))
            .collect();
        for _ in 0..1500 {
            let (at, len) = streams[next() as usize % streams.len()];
            let mut b = fatbin.to_vec();
            b[at + next() as usize % len] = next() as u8;
            match check(&b) {
                Ok(_) => passed += 1,
                Err(_) => refused += 1,
            }
        }
    }
    assert!(refused > 1000, "{passed} passed, {refused} refused");
}

#[test]
fn truncations_are_refused_as_truncated() {
    let cubins = CUBIN_ARCHS
        .iter()
        .flat_map(|&sm| [cubin("elementwise", sm), cubin("noop", sm)]);
    for blob in cubins.chain([ELEMENTWISE_FATBIN]) {
        for cut in [10, 63, 64, blob.len() / 2, blob.len() - 1] {
            let reason = refusal(&blob[..cut]);
            assert!(reason.contains("truncated"), "cut at {cut}: {reason}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CUDA 13's blobs, e_flags and fatbin entry headers
// ---------------------------------------------------------------------------------------------

/// nvcc 13.0's fatbin of `kernels/elementwise.cu`: zstd-compressed PTX (an 80-byte header with an
/// empty options record) and an sm_90 cubin of ABI version 8 (see `testdata/make.py`).
const NVCC13_FATBIN: &[u8] = include_bytes!("testdata/nvcc13.0.elementwise.fatbin");
/// NVRTC 13.5's PTX and cubins of it in nvFatbin 13.5's fatbin: names, ptxas options, the record
/// of an sm_100 entry (see `testdata/make.py`).
const CUDA13_FATBIN: &[u8] = include_bytes!("testdata/cuda13.elementwise.fatbin");

/// The payload of entry `entry` of fatbin `b`.
fn payload<'b>(b: &'b [u8], entry: &FatEntry) -> &'b [u8] {
    &b[entry.payload_at()..][..entry.payload]
}

#[test]
fn cuda_13_blobs_pass() {
    assert_eq!(check(NVCC13_FATBIN), Ok(BlobKind::Fatbin));
    assert_eq!(code_targets(NVCC13_FATBIN), "compute_90 PTX, sm_90 SASS");
    let nvcc = fatbin_entries(NVCC13_FATBIN);
    assert_eq!(
        nvcc.iter().map(|e| (e.kind, e.header)).collect::<Vec<_>>(),
        [(1, 80), (2, 64)]
    );
    let cubin = payload(NVCC13_FATBIN, &nvcc[1]);
    assert_eq!(check(cubin), Ok(BlobKind::Cubin));
    assert_eq!((cubin[8], Image::new(cubin).u32(48)), (8, 0x0600_5a04));

    assert_eq!(check(CUDA13_FATBIN), Ok(BlobKind::Fatbin));
    assert_eq!(
        code_targets(CUDA13_FATBIN),
        "compute_75 PTX, sm_75 SASS, sm_90 SASS, sm_100 SASS"
    );
    let image = Image::new(CUDA13_FATBIN);
    let entries = fatbin_entries(CUDA13_FATBIN);
    // The PTX named, with ptxas options; sm_75 and sm_90 plain; sm_100 named, with the record
    // nvFatbin 13 gives sm_100 and later, and flag 0x100_0000.
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.kind, e.header, e.arch))
            .collect::<Vec<_>>(),
        [(1, 112, 75), (2, 64, 75), (2, 64, 90), (2, 136, 100)]
    );
    let (ptx, sm100) = (entries[0], entries[3]);
    assert_eq!((image.u32(ptx.at + 32), image.u32(ptx.at + 36)), (64, 14));
    assert_eq!(&image.b[ptx.at + 64..][..15], b"elementwise.cu\0");
    assert_eq!(image.u32(ptx.at + 20), 80);
    let (options, size) = (
        image.u32(ptx.at + 80) as usize,
        image.u32(ptx.at + 84) as usize,
    );
    assert_eq!(
        &image.b[ptx.at + options..][..size + 1],
        b"-O3 --maxrregcount=64\0"
    );
    assert_eq!(image.u64(sm100.at + 40), 0x100_0011);
    assert_eq!(
        (image.u32(sm100.at + 20), image.u32(sm100.at + 80)),
        (80, 88)
    );
    for (entry, (sm, flags)) in
        entries[1..]
            .iter()
            .zip([(75, 0x0600_4b04), (90, 0x0600_5a04), (100, 0x0600_6402)])
    {
        let cubin = payload(CUDA13_FATBIN, entry);
        assert_eq!(check(cubin), Ok(BlobKind::Cubin), "sm_{sm}");
        assert_eq!((cubin[8], Image::new(cubin).u32(48)), (8, flags));
        assert_eq!(sm_arch(cubin), Some(sm));
    }
}

/// The cubins of every ELF ABI version in use: NVRTC 12.0's (version 7, committed), nvcc 13's
/// layout of them, and NVRTC 13.5's (version 8).
fn cubins_of_both_layouts() -> Vec<(String, Vec<u8>)> {
    let mut cubins = Vec::new();
    for &sm in CUBIN_ARCHS {
        for (name, blob) in cubin_for_model("demo", sm).unwrap() {
            cubins.push((format!("{name}.sm_{sm}"), blob.to_vec()));
            cubins.push((
                format!("{name}.sm_{sm}, nvcc 13 style"),
                nvcc13_style(blob).b,
            ));
        }
    }
    for entry in &fatbin_entries(CUDA13_FATBIN)[1..] {
        let name = format!("NVRTC 13.5 elementwise.sm_{}", entry.arch);
        cubins.push((name, payload(CUDA13_FATBIN, entry).to_vec()));
    }
    cubins
}

/// The flag bits of `e_flags` around the SM number and the virtual architecture are the driver's
/// to judge: nvcc 13 sets `0x0100_0000` (`-shared`, NPP, cuRAND), and other toolkits others. But
/// bit 31 in the layout of ABI version 7 and bit 0 in that of version 8, which the driver crashes
/// on and no toolchain sets.
#[test]
fn e_flags_bits_are_the_drivers_to_judge() {
    for (name, blob) in cubins_of_both_layouts() {
        let image = Image::new(&blob);
        let flags = image.u32(48);
        let (numbers, crashing): (u32, u32) = if blob[8] == 7 {
            (0x00ff_00ff, 0x8000_0000)
        } else {
            (0x00ff_ff00, 1)
        };
        for bit in (0..32)
            .map(|n| 1u32 << n)
            .filter(|bit| bit & (numbers | crashing) == 0)
        {
            let with = image.with(48, &(flags | bit).to_le_bytes());
            assert_eq!(check(&with), Ok(BlobKind::Cubin), "{name}: {bit:#x}");
        }
        let all = image.with(48, &(flags | !(numbers | crashing)).to_le_bytes());
        assert_eq!(check(&all), Ok(BlobKind::Cubin), "{name}: every flag bit");
        let (bit, abi) = (crashing.trailing_zeros(), blob[8]);
        assert_refused(
            &image.with(48, &(flags | crashing).to_le_bytes()),
            &[
                &format!("sets bit {bit}"),
                &format!("ABI version {abi}"),
                "the driver crashes on",
            ],
        );
    }
    // The first fatbin of an `nvcc -shared` library built by nvcc 13.0 for sm_90.
    let real = Image::new(demo_cubin("elementwise"));
    let shared = nvcc13_style(&real.b);
    assert_eq!(
        check(&shared.with(48, &0x0500_5a04u32.to_le_bytes())),
        Ok(BlobKind::Cubin)
    );
}

#[test]
fn e_flags_name_a_plausible_sm_and_virtual_architecture() {
    for (name, blob) in cubins_of_both_layouts() {
        let image = Image::new(&blob);
        let flags = image.u32(48);
        let with = |flags: u32| image.with(48, &flags.to_le_bytes());
        // Where the SM number is, and the virtual architecture (0 in CUDA 13's cubins).
        let shift = if blob[8] == 7 { 0 } else { 8 };
        let sm = (flags >> shift) & 0xff;
        let with_sm = |sm: u32| with(flags & !(0xff << shift) | sm << shift);
        let with_virtual = |v: u32| with(flags & !0xff_0000 | v << 16);
        for bad in [0, 19, 130, 144, 190, 255] {
            assert_refused(
                &with_sm(bad),
                &[&format!("names SM {bad}, not an SM number from 20 to 129")],
            );
        }
        for good in [20, 61, 121, 129] {
            assert_eq!(
                check(&with_sm(good)),
                Ok(BlobKind::Cubin),
                "{name} as sm_{good}"
            );
        }
        // Any plausible virtual architecture: which one the SASS was made from is the driver's
        // to judge.
        for ok in [0, 20, sm, sm + 1, 129] {
            assert_eq!(
                check(&with_virtual(ok)),
                Ok(BlobKind::Cubin),
                "{name}: {ok}"
            );
        }
        for bad in [5, 19, 130, 255] {
            assert_refused(
                &with_virtual(bad),
                &[&format!(
                    "names virtual architecture {bad}, not an SM number"
                )],
            );
        }
        // Other ABI versions' layouts are unknown, so their numbers are not checked.
        for abi in [0, 6, 9, 0xff] {
            assert_eq!(
                check(&image.with(8, &[abi])),
                Ok(BlobKind::Cubin),
                "{name}: {abi}"
            );
        }
    }
}

/// The `e_flags` that crashed the driver (an H200, driver 580) in cubins of other architectures
/// than the device's are refused for their SM numbers (and for bit 31, which they set too).
#[test]
fn e_flags_that_crashed_the_driver_are_refused() {
    for &sm in &[75, 80, 86, 89] {
        for (name, blob) in cubin_for_model("demo", sm).unwrap() {
            let image = Image::new(blob);
            for (flags, named) in [
                (0xffff_ffffu32, 255),
                (0xa893_ec90, 144),
                (0xffa9_e3be, 190),
            ] {
                // Bit 31 is refused too, first (ABI version 7); without it, the SM number.
                let reason = refusal(&image.with(48, &flags.to_le_bytes()));
                assert!(reason.contains("sets bit 31"), "{name}: {reason}");
                let reason = refusal(&image.with(48, &(flags & 0x7fff_ffff).to_le_bytes()));
                assert!(
                    reason.contains(&format!("names SM {named}")),
                    "{name}: {reason}"
                );
            }
        }
    }
}

/// `real` with `bytes` at offset `at` of entry `entry`'s header.
fn with_entry_field(real: &[u8], entry: &FatEntry, at: usize, bytes: &[u8]) -> Vec<u8> {
    Image::new(real).with(entry.at + at, bytes)
}

/// Of an entry's header, the version of its layout and the sizes are structure, checked; flags,
/// architecture and the field at 48 are the driver's to judge.
#[test]
fn fatbin_entry_fields_are_the_drivers_to_judge_but_sizes() {
    for (fatbin, name) in [
        (ELEMENTWISE_FATBIN, "committed"),
        (NVCC13_FATBIN, "nvcc 13.0"),
        (CUDA13_FATBIN, "nvFatbin 13.5"),
    ] {
        for (index, entry) in fatbin_entries(fatbin).iter().enumerate() {
            let with = |at: usize, bytes: &[u8]| with_entry_field(fatbin, entry, at, bytes);
            let label = format!("fatbin entry {index} (");
            assert_refused(
                &with(2, &0x0102u16.to_le_bytes()),
                &[&label, "entry version 0x0102"],
            );
            // Every flag bit but those of compression: nvcc 12.9 and 13 set 0x10_0000 and
            // 0x20_0000 on cuBLASLt's and Blackwell entries.
            let flags = Image::new(fatbin).u64(entry.at + 40);
            for bit in [
                0x2u64,
                0x4,
                0x8,
                0x20,
                0x40,
                0x80,
                0x100,
                0x800,
                0x4000,
                0x10_0000,
                0x20_0000,
                0x100_0000,
                0x200_0000,
                1 << 63,
            ] {
                assert_eq!(
                    check(&with(40, &(flags | bit).to_le_bytes())),
                    Ok(BlobKind::Fatbin),
                    "{name}: entry {index} with flag {bit:#x}"
                );
            }
            // Architectures no device has: the entry is never picked.
            for arch in [0u32, 19, 130, u32::MAX] {
                assert_eq!(
                    check(&with(28, &arch.to_le_bytes())),
                    Ok(BlobKind::Fatbin),
                    "{name}: entry {index} for {arch}"
                );
            }
            assert_eq!(
                check(&with(48, &[1])),
                Ok(BlobKind::Fatbin),
                "{name}: {index}"
            );
            if flags & 0xb000 == 0 {
                // Uncompressed: no compressed or uncompressed size.
                for at in [16, 56] {
                    assert_refused(&with(at, &[8]), &[&label, "an uncompressed entry (flags"]);
                }
            }
        }
    }
    // An ELF entry labelled for another architecture than its cubin's: the driver's choice.
    let (_, entry) = fatbin_elf_entry(80);
    assert_eq!(
        check(&with_entry_field(
            ELEMENTWISE_FATBIN,
            &entry,
            28,
            &86u32.to_le_bytes()
        )),
        Ok(BlobKind::Fatbin)
    );
}

/// Only the entries the driver may pick for the device have their code read: a broken sm_80
/// cubin does not sink a fatbin for an sm_90 device, and is refused for an sm_86 one, and for any
/// device by `validate_blob`.
#[test]
fn entries_the_device_never_picks_do_not_sink_a_fatbin() {
    let (index, entry) = fatbin_elf_entry(80);
    let mut broken = ELEMENTWISE_FATBIN.to_vec();
    // The cubin's section header table moved past its end.
    let shoff = entry.payload_at() + 40;
    broken[shoff..shoff + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let device = |cc| super::validate_blob_for_device("m", &broken, cc);
    assert_eq!(device((9, 0)).unwrap(), BlobKind::Fatbin);
    assert_eq!(device((7, 5)).unwrap(), BlobKind::Fatbin);
    for cc in [(8, 0), (8, 6), (8, 9)] {
        let e = device(cc).unwrap_err().to_string();
        assert!(
            e.contains(&format!("fatbin entry {index} (ELF sm_80")),
            "{cc:?}: {e}"
        );
    }
    assert!(refusal(&broken).contains(&format!("fatbin entry {index} (ELF sm_80")));
    // An entry of a kind Atlas does not know is never picked: only its header is read.
    let mut unknown = broken.clone();
    unknown[entry.at] = 8;
    assert_eq!(check(&unknown), Ok(BlobKind::Fatbin));
    // PTX may be picked for every device at least as new as its target (compute_75 for sm_75
    // up), unless the device has SASS of its own in the fatbin: the driver then loads that
    // cubin, which is all a load hands it.
    let ptx = fatbin_entries(ELEMENTWISE_FATBIN)[0];
    let mut broken_ptx = ELEMENTWISE_FATBIN.to_vec();
    broken_ptx[ptx.payload_at()..ptx.payload_at() + 8].copy_from_slice(b"nonsense");
    assert!(!crate::code::target::jit_forced());
    for (cc, passes) in [
        ((7, 0), true),
        ((7, 5), true),
        ((8, 6), false),
        ((9, 0), true),
        ((12, 0), false),
    ] {
        let verdict = super::validate_blob_for_device("m", &broken_ptx, cc);
        assert_eq!(verdict.is_ok(), passes, "{cc:?}: {verdict:?}");
    }
    assert!(refusal(&broken_ptx).contains("fatbin entry 0 (PTX sm_75"));
}

/// What the driver loads of a fatbin is settled only by one entry of SASS of exactly the
/// device's SM, an executable cubin, with no other SASS the device may load: else the whole
/// fatbin is checked for the device.
#[test]
fn a_fatbin_is_settled_by_one_executable_cubin_of_the_devices_own_sm() {
    use super::fatbin::sole_sass;
    let settled = |b: &[u8], sm| sole_sass(b, sm).unwrap().map(|cubin| cubin.len());
    let (_, sm90) = fatbin_elf_entry(90);
    assert_eq!(settled(ELEMENTWISE_FATBIN, 90), Some(sm90.payload));
    assert_eq!(
        settled(ELEMENTWISE_FATBIN, 75),
        Some(fatbin_elf_entry(75).1.payload)
    );
    // sm_86 may load the sm_80 SASS too; sm_120 has no SASS of its own.
    assert_eq!(settled(ELEMENTWISE_FATBIN, 86), None);
    assert_eq!(settled(ELEMENTWISE_FATBIN, 120), None);
    // Two entries of sm_90 SASS (as sm_90 and sm_90a are): the driver's choice.
    let (_, sm89) = fatbin_elf_entry(89);
    let twice = with_entry_field(ELEMENTWISE_FATBIN, &sm89, 28, &90u32.to_le_bytes());
    assert_eq!(settled(&twice, 90), None);
    // An entry of a kind Atlas does not know: the driver's choice.
    let mut unknown = ELEMENTWISE_FATBIN.to_vec();
    unknown[sm89.at] = 8;
    assert_eq!(settled(&unknown, 90), None);
    // A relocatable cubin (ET_REL), or one whose e_flags name another SM than its entry.
    let mut relocatable = ELEMENTWISE_FATBIN.to_vec();
    relocatable[sm90.payload_at() + 16] = 1;
    assert_eq!(settled(&relocatable, 90), None);
    let labelled = with_entry_field(ELEMENTWISE_FATBIN, &sm90, 28, &91u32.to_le_bytes());
    assert_eq!(settled(&labelled, 91), None);
    // The settling entry's code is checked, and every header.
    let mut broken = ELEMENTWISE_FATBIN.to_vec();
    broken[sm90.payload_at() + 40..sm90.payload_at() + 48].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(said(sole_sass(&broken, 90).unwrap_err()).contains("(ELF sm_90"));
    let bad_header = with_entry_field(ELEMENTWISE_FATBIN, &sm89, 2, &0x0202u16.to_le_bytes());
    assert!(said(sole_sass(&bad_header, 90).unwrap_err()).contains("entry version"));
}

#[test]
fn fatbin_entry_names_lie_in_their_header() {
    let entries = fatbin_entries(CUDA13_FATBIN);
    for (index, entry) in [(0, entries[0]), (3, entries[3])] {
        let with = |at: usize, bytes: &[u8]| with_entry_field(CUDA13_FATBIN, &entry, at, bytes);
        let name = |offset: u32, size: u32| {
            let mut field = offset.to_le_bytes().to_vec();
            field.extend_from_slice(&size.to_le_bytes());
            with(32, &field)
        };
        let refused = format!("fatbin entry {index} (");
        // The name ends in a NUL inside the header, or there is none.
        assert_eq!(check(&name(64, 14)), Ok(BlobKind::Fatbin));
        assert_eq!(check(&name(0, 0)), Ok(BlobKind::Fatbin));
        for (offset, size) in [
            (64, 3),
            (64, 16),
            (63, 1),
            (0, 14),
            (8, 0),
            (u32::MAX, 0),
            (0x7fff_ffff, 0),
            (entry.header as u32, 0),
            (64, u32::MAX),
        ] {
            assert_refused(
                &name(offset, size),
                &[
                    &refused,
                    &format!(
                        "its name at offset {offset} + size {size} (at 32) is not a \
                         NUL-terminated string inside its {}-byte header",
                        entry.header
                    ),
                ],
            );
        }
        // Its terminating NUL overwritten.
        assert_refused(
            &with(64 + 14, b"X"),
            &[&refused, "its name at offset 64 + size 14"],
        );
    }
}

#[test]
fn fatbin_entry_options_lie_in_their_header() {
    // The committed fatbin's PTX entry: the record at 64 names 0 bytes of options at 72.
    let ptx = fatbin_entries(ELEMENTWISE_FATBIN)[0];
    let with = |at: usize, bytes: &[u8]| with_entry_field(ELEMENTWISE_FATBIN, &ptx, at, bytes);
    let real = Image::new(ELEMENTWISE_FATBIN);
    assert_eq!(
        (
            real.u32(ptx.at + 20),
            real.u32(ptx.at + 64),
            real.u32(ptx.at + 68)
        ),
        (64, 72, 0)
    );
    let prefix = "fatbin entry 0 (PTX sm_75 at offset 16): ";
    // No record at all, or options inside the header.
    assert_eq!(check(&with(20, &[0])), Ok(BlobKind::Fatbin));
    assert_eq!(check(&with(64, &[73])), Ok(BlobKind::Fatbin));
    let mut options = real.clone();
    options.set(ptx.at + 68, &[3]).set(ptx.at + 72, b"-O3\0");
    assert_eq!(check(&options.b), Ok(BlobKind::Fatbin));
    // The record outside the extension.
    for at in [8u32, 63, 76, 80, 0x4000, u32::MAX] {
        assert_refused(
            &with(20, &at.to_le_bytes()),
            &[&format!(
                "{prefix}its options record at offset {at} (at 20) is not inside its 80-byte header"
            )],
        );
    }
    // The options outside the header, or without their NUL (as measured to crash the driver).
    for (offset, size) in [
        (86u32, 0u32),
        (333, 0),
        (0x7fff_ffff, 0),
        (8, 0),
        (72, 8),
        (79, 1),
    ] {
        let mut record = offset.to_le_bytes().to_vec();
        record.extend_from_slice(&size.to_le_bytes());
        assert_refused(
            &with(64, &record),
            &[&format!(
                "{prefix}its options at offset {offset} + size {size} (the record at 64) are not \
                 a NUL-terminated string inside its 80-byte header"
            )],
        );
    }
    assert_refused(
        &with(72, &0x7fff_ffff_ffff_ffffu64.to_le_bytes()),
        &[&format!("{prefix}its options at offset 72 + size 0")],
    );
    // No options at all (offset 0, size 0), as CUDA 12-era libraries write them.
    assert_eq!(check(&with(64, &[0; 8])), Ok(BlobKind::Fatbin));
    // What the options say is the driver's to judge, a command line or not.
    let mut binary = real.clone();
    binary
        .set(ptx.at + 68, &[2])
        .set(ptx.at + 72, b"\x01\x02\0");
    assert_eq!(check(&binary.b), Ok(BlobKind::Fatbin));

    // nvFatbin 13.5's: real options, and an sm_100 entry's binary record.
    let entries = fatbin_entries(CUDA13_FATBIN);
    let cuda13 = Image::new(CUDA13_FATBIN);
    let sm100 = entries[3];
    let record = sm100.at + cuda13.u32(sm100.at + 20) as usize;
    let (offset, size) = (cuda13.u32(record), cuda13.u32(record + 4));
    assert_eq!((offset, size), (88, 40));
    let end = (sm100.header as u32 - offset).to_le_bytes();
    assert_eq!(check(&cuda13.with(record + 4, &end)), Ok(BlobKind::Fatbin));
    assert_refused(
        &cuda13.with(
            record + 4,
            &(sm100.header as u32 - offset + 1).to_le_bytes(),
        ),
        &[
            "fatbin entry 3 (ELF sm_100 at offset",
            "its options at offset 88 + size 49 (the record at 80) are not bytes inside its \
             136-byte header",
        ],
    );
    assert_refused(
        &cuda13.with(record, &0u32.to_le_bytes()),
        &["its options at offset 0 + size 40"],
    );
    let ptx = entries[0];
    let options = ptx.at + cuda13.u32(ptx.at + cuda13.u32(ptx.at + 20) as usize) as usize;
    assert_eq!(
        check(&cuda13.with(options + 3, b"\n")),
        Ok(BlobKind::Fatbin)
    );
    assert_refused(
        &cuda13.with(options + 21, b"X"),
        &["fatbin entry 0 (PTX sm_75 at offset 16): its options at offset 88 + size 21"],
    );
}

/// A file of `tests/fixtures/arch_variants/`: `k.cu` built by nvcc 13.0.
macro_rules! arch_variant {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/arch_variants/",
            $name
        ))
    };
}

/// The architecture a cubin says it is built for, as `sm_` or `compute_` would follow it.
fn arch_of(cubin: &[u8]) -> Option<String> {
    cubin_arch(cubin).map(|arch| arch.to_string())
}

/// "a" code is marked in a cubin by `e_flags` (CUDA 12: 0x800 in ABI version 7's layout; CUDA
/// 12.9: 0x8 in version 8's) or, from CUDA 13, by `.nv.compat` attribute 0x09 = 1; "f" code not at
/// all.
#[test]
fn a_cubin_says_a_by_its_flags_or_its_compat_record() {
    for (cubin, want) in [
        (&arch_variant!("k.sm_90.cubin")[..], "90"),
        (arch_variant!("k.sm_90a.cubin"), "90a"),
        (arch_variant!("k.sm_100.cubin"), "100"),
        (arch_variant!("k.sm_100a.cubin"), "100a"),
        (arch_variant!("k.sm_100f.cubin"), "100"),
        (arch_variant!("k.sm_103a.cubin"), "103a"),
        (arch_variant!("k.sm_110f.cubin"), "110"),
        (arch_variant!("k.sm_120a.cubin"), "120a"),
        (arch_variant!("k.sm_120f.cubin"), "120"),
        (arch_variant!("k.sm_121a.cubin"), "121a"),
    ] {
        assert_eq!(arch_of(cubin).as_deref(), Some(want), "sm_{want}");
        assert_eq!(code_targets(cubin), format!("sm_{want} SASS"));
    }
    // CUDA 13: the same e_flags for sm_90 and sm_90a; sm_100 and sm_100f cubins differ only in
    // the options the toolkit note records (`-arch sm_100f`), not in e_flags or `.nv.compat`.
    let (plain, a) = (
        Image::new(arch_variant!("k.sm_90.cubin")),
        Image::new(arch_variant!("k.sm_90a.cubin")),
    );
    assert_eq!((plain.b[8], plain.u32(48)), (8, 0x0600_5a04));
    assert_eq!(a.u32(48), plain.u32(48));
    let (sm100, sm100f) = (
        Image::new(arch_variant!("k.sm_100.cubin")),
        Image::new(arch_variant!("k.sm_100f.cubin")),
    );
    assert_eq!(sm100.u32(48), sm100f.u32(48));
    let compat = |image: &Image| {
        let at = image.data(".nv.compat");
        image.b[at..at + image.size(".nv.compat") as usize].to_vec()
    };
    assert_eq!(compat(&sm100), compat(&sm100f));
    assert_eq!(compat(&sm100).len(), 36);
    // The record says it: set to 0, the cubin is plain sm_90; the section gone, too.
    let record = a.record(".nv.compat", 0x09);
    assert_eq!(a.b[record..record + 4], [2, 0x09, 1, 0]);
    assert_eq!(arch_of(&a.with(record + 2, &[0])).as_deref(), Some("90"));
    let retyped = a.with_field(".nv.compat", SH_TYPE, &SHT_CUDA_INFO.to_le_bytes());
    assert_eq!(arch_of(&retyped).as_deref(), Some("90"));
    // CUDA 12.9's mark in ABI version 8's layout, CUDA 12's in version 7's (NVRTC 12.0's cubin).
    assert_eq!(
        arch_of(&plain.with(48, &0x0600_5a0cu32.to_le_bytes())).as_deref(),
        Some("90a")
    );
    let nvrtc = Image::new(demo_cubin("noop"));
    assert_eq!(arch_of(&nvrtc.b).as_deref(), Some("90"));
    let marked = nvrtc.with(48, &(nvrtc.u32(48) | 0x800).to_le_bytes());
    assert_eq!(arch_of(&marked).as_deref(), Some("90a"));
    // Whatever the bytes, an answer and no panic: a section table or records cut short.
    for len in [0, 8, 52, 64, a.len() / 2, a.len() - 1] {
        let _ = cubin_arch(&a.b[..len]);
    }
    let past = a.with_field(".nv.compat", SH_SIZE, &u64::MAX.to_le_bytes());
    assert_eq!(arch_of(&past).as_deref(), Some("90"));
    let mut sized = a.clone();
    sized.set(record, &[4, 0x0b, 0xff, 0xff]);
    assert_eq!(arch_of(&sized.b).as_deref(), Some("90"));
}

/// A fatbin entry's flags say "a" (0x10_0000) and "f" (0x20_0000), for SASS and PTX alike;
/// 0x100_0000, on every ELF entry from sm_100 on, says neither.
#[test]
fn a_fatbin_entry_says_a_or_f_by_its_flags() {
    let codes = |fatbin: &[u8]| {
        fatbin::codes(fatbin)
            .map(|code| match code {
                Some(Code::Sass(arch)) => format!("sm_{arch}"),
                Some(Code::Ptx(arch)) => format!("compute_{arch}"),
                None => "unknown".into(),
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        codes(arch_variant!("k.mixed.fatbin")),
        ["sm_100a", "sm_100f", "sm_120f", "sm_90a"]
    );
    assert_eq!(
        code_targets(arch_variant!("k.mixed.fatbin")),
        "sm_100a SASS, sm_100f SASS, sm_120f SASS, sm_90a SASS"
    );
    for (fatbin, want) in [
        (&arch_variant!("k.sm_100.fatbin")[..], "sm_100"),
        (arch_variant!("k.sm_103a.fatbin"), "sm_103a"),
        (arch_variant!("k.sm_121f.fatbin"), "sm_121f"),
        (arch_variant!("k.compute_90a.fatbin"), "compute_90a"),
        (arch_variant!("k.compute_110f.fatbin"), "compute_110f"),
        (arch_variant!("k.compute_120.fatbin"), "compute_120"),
    ] {
        assert_eq!(codes(fatbin), [want]);
    }
    assert_eq!(
        codes(arch_variant!("k.sm_90a+compute_90.fatbin")),
        ["sm_90a", "compute_90"]
    );
    assert_eq!(
        code_targets(arch_variant!("k.compute_100f.ptx")),
        "compute_100f PTX (ISA 9.0)"
    );
}

/// What is handed over of the mixed fatbin (sm_100a, sm_100f, sm_120f, sm_90a SASS): the one
/// entry of exactly the device's SM when no other SASS it may load is there; "a" SASS of another
/// compute capability is none it may load.
#[test]
fn the_handover_counts_only_sass_the_device_may_load() {
    use super::fatbin::sole_sass;
    let mixed = arch_variant!("k.mixed.fatbin");
    let entries = fatbin_entries(mixed);
    let handed = |b: &[u8], sm| {
        sole_sass(b, sm)
            .unwrap()
            .map(|cubin| (cubin.as_ptr(), cubin.len()))
    };
    let entry = |b: &[u8], i: usize| {
        let entry = fatbin_entries(b)[i];
        let at = entry.payload_at();
        Some((b[at..].as_ptr(), entry.payload))
    };
    assert_eq!(entries.len(), 4);
    assert_eq!(handed(mixed, 90), entry(mixed, 3));
    assert_eq!(handed(mixed, 120), entry(mixed, 2));
    // 10.0: sm_100a and sm_100f, both its own (the driver chooses); 10.3 and 12.1: none their own.
    for sm in [100, 103, 121, 110] {
        assert_eq!(handed(mixed, sm), None, "sm_{sm}");
    }
    // sm_100a beside sm_103 SASS: on 10.3 the sm_103 entry settles it, the sm_100a one is none
    // it may load; its plain twin is, and then the driver chooses.
    let both = |first: &[u8], second: &[u8]| {
        let mut b = first.to_vec();
        b.extend_from_slice(&second[16..]);
        let body = (b.len() - 16) as u64;
        b[8..16].copy_from_slice(&body.to_le_bytes());
        b
    };
    let a_and_103 = both(
        arch_variant!("k.sm_100a.fatbin"),
        arch_variant!("k.sm_103.fatbin"),
    );
    assert_eq!(handed(&a_and_103, 103), entry(&a_and_103, 1));
    let plain_and_103 = both(
        arch_variant!("k.sm_100.fatbin"),
        arch_variant!("k.sm_103.fatbin"),
    );
    assert_eq!(handed(&plain_and_103, 103), None);
    // A fatbin of "a" code for another compute capability only: nothing to hand over.
    assert_eq!(handed(arch_variant!("k.sm_100a.fatbin"), 103), None);
}
