//! The checks on the committed blobs: every one passes, and each class of refusal is shown on a
//! real cubin, fatbin or bundle with one field broken.

use std::borrow::Cow;

use atlas_kernels::{CUBIN_ARCHS, ELEMENTWISE_FATBIN, MODELS, cubin_for_model, ptx_for_model};

use super::*;

/// A blob of the demo model by module name.
fn demo_cubin(module: &str) -> &'static [u8] {
    cubin_for_model("demo", 90)
        .unwrap()
        .iter()
        .find(|(name, _)| *name == module)
        .unwrap()
        .1
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

    fn header_of(&self, index: usize) -> usize {
        self.u64(40) as usize + 64 * index
    }

    /// The index of the section called `name`.
    fn index(&self, name: &str) -> usize {
        let names = self.u64(self.header_of(usize::from(self.u16(62))) + 24) as usize;
        (0..usize::from(self.u16(60)))
            .find(|&i| {
                let at = names + self.u32(self.header_of(i)) as usize;
                self.b[at..].starts_with(name.as_bytes()) && self.b[at + name.len()] == 0
            })
            .unwrap_or_else(|| panic!("no section {name}"))
    }

    /// Where field `field` (byte offset in a section header) of section `name` is.
    fn field(&self, name: &str, field: usize) -> usize {
        self.header_of(self.index(name)) + field
    }

    /// Where the bytes of section `name` start.
    fn data(&self, name: &str) -> usize {
        self.u64(self.field(name, 24)) as usize
    }

    /// Where symbol `n` is.
    fn symbol(&self, n: usize) -> usize {
        self.data(".symtab") + 24 * n
    }

    /// Where the first `.nv.info` record of `attribute` in section `name` is.
    fn record(&self, name: &str, attribute: u8) -> usize {
        let (start, size) = (self.data(name), self.u64(self.field(name, 32)) as usize);
        let mut at = start;
        while at < start + size {
            if self.b[at + 1] == attribute {
                return at;
            }
            let value = if self.b[at] == 4 {
                usize::from(self.u16(at + 2))
            } else {
                0
            };
            at = (at + 4 + value + 3) & !3;
        }
        panic!("no attribute {attribute:#x} in {name}")
    }
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

#[test]
fn every_committed_blob_passes() {
    let mut count = 0;
    for model in MODELS {
        let cubins = CUBIN_ARCHS
            .iter()
            .map(|&sm| cubin_for_model(model, sm).unwrap());
        for blobs in std::iter::once(ptx_for_model(model).unwrap()).chain(cubins) {
            for (name, blob) in blobs {
                check(blob).unwrap_or_else(|e| panic!("{model}/{name}: {e}"));
                count += 1;
            }
        }
    }
    assert_eq!(check(ELEMENTWISE_FATBIN), Ok(BlobKind::Fatbin));
    // Straight from disk too, so that blobs added there later are covered without a change here.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/gen");
    let mut on_disk = 0;
    for file in std::fs::read_dir(dir).unwrap() {
        let path = file.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let expected = match path.extension().and_then(|e| e.to_str()) {
            Some("ptx") => BlobKind::Ptx,
            Some("cubin") => BlobKind::Cubin,
            Some("fatbin") => BlobKind::Fatbin,
            _ => continue,
        };
        let blob = std::fs::read(&path).unwrap();
        assert_eq!(check(&blob), Ok(expected), "{name}");
        on_disk += 1;
    }
    assert!(
        count >= 14 && on_disk >= 15,
        "{count} embedded, {on_disk} on disk"
    );
}

#[test]
fn the_sm_architecture_comes_from_e_flags_in_both_layouts() {
    for model in MODELS {
        for &sm in CUBIN_ARCHS {
            for (name, blob) in cubin_for_model(model, sm).unwrap() {
                // NVRTC 12.0: EI_ABIVERSION 7, the SM number in the low byte and in bits 16-23.
                assert_eq!(blob[8], 7, "{model}/{name}");
                assert_eq!(sm_arch(blob), Some(sm), "{model}/{name} for sm_{sm}");
            }
        }
    }
    // The newer layout (nvcc 13): EI_ABIVERSION 8, the SM number in bits 8-15.
    let mut new = Image::new(demo_cubin("noop"));
    new.set(8, &[8]).set(48, &0x0600_5a04u32.to_le_bytes());
    assert_eq!(sm_arch(&new.b), Some(90));
    let mut old = Image::new(demo_cubin("noop"));
    old.set(8, &[9]);
    assert_eq!(sm_arch(&old.b), None, "an ABI version after the known ones");
    let mut amd = Image::new(demo_cubin("noop"));
    amd.set(18, &224u16.to_le_bytes());
    assert_eq!(sm_arch(&amd.b), None);
    assert_eq!(sm_arch(ELEMENTWISE_FATBIN), None);
    assert_eq!(sm_arch(&demo_cubin("noop")[..40]), None);

    assert_eq!(code_targets(demo_cubin("noop")), "sm_90 SASS");
    assert_eq!(code_targets(&amd.b), "an AMD GPU code object");
    assert_eq!(
        code_targets(ELEMENTWISE_FATBIN),
        "compute_75 PTX, sm_75 SASS, sm_80 SASS, sm_86 SASS, sm_89 SASS, sm_90 SASS"
    );
    assert_eq!(
        code_targets(ptx_for_model("demo").unwrap()[0].1),
        "PTX for sm_75"
    );
    assert_eq!(code_targets(b"\xff\xfe"), "an unknown binary");
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

#[test]
fn other_binaries_get_a_terminating_nul() {
    let (kind, bytes) = prepare("m", &[0xff, 0xfe]).unwrap();
    assert_eq!(kind, BlobKind::Binary);
    assert_eq!(&*bytes, &[0xff, 0xfe, 0]);
}

#[test]
fn elf_header_fields_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let len = real.b.len();
    let broken = |at: usize, bytes: &[u8]| {
        let mut image = real.clone();
        image.set(at, bytes);
        image.b
    };
    assert_refused(&real.b[..63], &["truncated", "64-byte header"]);
    assert_refused(&broken(4, &[1]), &["64-bit"]);
    assert_refused(&broken(5, &[2]), &["little-endian"]);
    assert_refused(&broken(6, &[0]), &["ELF version"]);
    assert_refused(&broken(20, &[2]), &["ELF version"]);
    assert_refused(
        &broken(18, &62u16.to_le_bytes()),
        &["machine 62", "CUDA (190)"],
    );
    assert_refused(&broken(16, &[9]), &["file type 9"]);
    assert_refused(&broken(52, &[40]), &["e_ehsize is 40"]);
    assert_refused(&broken(54, &[32]), &["e_phentsize is 32"]);
    assert_refused(&broken(58, &[32]), &["e_shentsize is 32"]);
    // The section header table past the end, overlapping the header, or wrapping around.
    let past = format!("past the end of the {}-byte blob", read::Size(len as u64));
    assert_refused(
        &broken(40, &(len as u64 - 64).to_le_bytes()),
        &["section header table (18 entries)", &past, "truncated"],
    );
    assert_refused(
        &broken(40, &8u64.to_le_bytes()),
        &["overlaps the ELF header"],
    );
    assert_refused(
        &broken(40, &u64::MAX.to_le_bytes()),
        &["section header table"],
    );
    assert_refused(&broken(60, &[200]), &["section header table (200 entries)"]);
    assert_refused(&broken(60, &[0, 0xff]), &["reserved range"]);
    assert_refused(&broken(60, &[0, 0]), &["extended section numbering"]);
    assert_refused(
        &broken(32, &(len as u64).to_le_bytes()),
        &["program header table"],
    );
    assert_refused(
        &broken(56, &[0xff, 0xff]),
        &["extended program header numbering"],
    );
    assert_refused(&broken(62, &[18]), &["e_shstrndx 18"]);
    assert_refused(&broken(62, &[0]), &["e_shstrndx 0"]);
    assert_refused(&broken(62, &[3]), &["section 3", "not a string table"]);
    // No section table at all: an ELF file, but not a cubin.
    let mut bare = broken(40, &0u64.to_le_bytes());
    bare[60..62].copy_from_slice(&[0, 0]);
    assert_refused(&bare, &["without a section header table"]);
}

#[test]
fn section_header_fields_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let broken = |name: &str, field: usize, bytes: &[u8]| {
        let mut image = real.clone();
        image.set(real.field(name, field), bytes);
        image.b
    };
    // The example of the documentation: bytes past the end.
    let at = real.data(".nv.info.scale") as u64;
    assert_refused(
        &broken(".nv.info.scale", SH_OFFSET, &(5600 - 100u64).to_le_bytes()),
        &[
            "section 10 (.nv.info.scale): offset 5500 + size 104 is past the end of the \
           5,600-byte blob (truncated or corrupt)",
        ],
    );
    assert_refused(
        &broken(".nv.info.scale", SH_SIZE, &(5600 - at + 1).to_le_bytes()),
        &["section 10 (.nv.info.scale)", "past the end"],
    );
    assert_refused(
        &broken(".text.axpy", SH_SIZE, &u64::MAX.to_le_bytes()),
        &["section 13 (.text.axpy)", "past the end"],
    );
    // NOBITS sections have no bytes in the file: their offset and size point nowhere.
    assert_eq!(
        check(&broken(
            ".nv.shared.reserved.0",
            SH_SIZE,
            &(1u64 << 40).to_le_bytes()
        )),
        Ok(BlobKind::Cubin)
    );
    assert_refused(
        &broken(".nv.info.scale", SH_NAME, &5000u32.to_le_bytes()),
        &[
            "section 10: its name offset 5000",
            "315-byte section name table",
        ],
    );
    assert_refused(
        &broken(".symtab", SH_LINK, &99u32.to_le_bytes()),
        &["section 3 (.symtab): sh_link 99 is not one of the 18 sections"],
    );
    assert_refused(
        &broken(".symtab", SH_LINK, &3u32.to_le_bytes()),
        &["section 3 (.symtab): links to section 3 (.symtab), which is not a string table"],
    );
    assert_refused(
        &broken(".nv.info.axpy", SH_INFO, &18u32.to_le_bytes()),
        &["section 9 (.nv.info.axpy): sh_info 18", "SHF_INFO_LINK"],
    );
    assert_refused(
        &broken(".nv.constant0.scale", SH_INFO, &0u32.to_le_bytes()),
        &["section 17 (.nv.constant0.scale): sh_info 0"],
    );
    assert_refused(
        &broken(".symtab", SH_ENTSIZE, &16u64.to_le_bytes()),
        &["section 3 (.symtab): entry size 16", "24-byte"],
    );
    assert_refused(
        &broken(".symtab", SH_SIZE, &(13 * 24 - 1u64).to_le_bytes()),
        &["whole 24-byte entries"],
    );
    assert_refused(
        &broken(".symtab", SH_INFO, &14u32.to_le_bytes()),
        &["sh_info 14", "past its 13 symbols"],
    );
    assert_refused(
        &broken(".symtab", SH_TYPE, &1u32.to_le_bytes()),
        &["without a symbol table"],
    );
    assert_refused(
        &broken(".text.axpy", SH_ALIGN, &96u64.to_le_bytes()),
        &["alignment 96 is not a power of two"],
    );
    assert_refused(
        &broken(".strtab", SH_SIZE, &(0x180 - 1u64).to_le_bytes()),
        &["section 2 (.strtab): the string table does not end with a NUL"],
    );
    assert_refused(
        &broken(".shstrtab", SH_SIZE, &(0x13b - 1u64).to_le_bytes()),
        &["section name table", "does not end with a NUL"],
    );
    assert_refused(
        &{
            let mut image = real.clone();
            image.set(image.header_of(0) + SH_TYPE, &1u32.to_le_bytes());
            image.b
        },
        &["section 0 has a non-zero byte at offset 4 of its header"],
    );
    assert_refused(
        &broken(".nv.constant0.scale", SH_FLAGS, &0x842u64.to_le_bytes()),
        &["section 17 (.nv.constant0.scale): flagged compressed (SHF_COMPRESSED)"],
    );
    // A section header with an unknown type and flags but sound offsets is not the checks' call.
    assert_eq!(
        check(&broken(
            ".debug_frame",
            SH_TYPE,
            &0x6000_1234u32.to_le_bytes()
        )),
        Ok(BlobKind::Cubin)
    );
    assert_refused(
        &broken(".nv.info", SH_FLAGS, &0x40u64.to_le_bytes()),
        &["section 7 (.nv.info): sh_info 0 is flagged as a section index (SHF_INFO_LINK)"],
    );
}

#[test]
fn program_headers_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let phoff = real.u64(32) as usize;
    let mut image = real.clone();
    image.set(phoff + 56 * 2 + 8, &5000u64.to_le_bytes());
    assert_refused(&image.b, &["program header 2 (type 0x1)", "past the end"]);
    let mut image = real.clone();
    image.set(phoff + 56 * 2 + 40, &1u64.to_le_bytes());
    assert_refused(
        &image.b,
        &["program header 2", "in the file but 1 in memory"],
    );
}

#[test]
fn symbols_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let broken = |n: usize, field: usize, bytes: &[u8]| {
        let mut image = real.clone();
        image.set(real.symbol(n) + field, bytes);
        image.b
    };
    assert_refused(
        &broken(9, 0, &0x180u32.to_le_bytes()),
        &[
            "section 3 (.symtab): symbol 9: its name offset 384",
            "384-byte string table section 2 (.strtab)",
        ],
    );
    assert_refused(
        &broken(9, 6, &99u16.to_le_bytes()),
        &["symbol 9 (axpy): section index 99 is not one of the 18 sections"],
    );
    assert_refused(
        &broken(9, 6, &0xff05u16.to_le_bytes()),
        &["symbol 9 (axpy)", "0xff05 is reserved"],
    );
    assert_refused(&broken(9, 6, &0xffffu16.to_le_bytes()), &["SHN_XINDEX"]);
    // axpy is a 512-byte function at 0 of its 512-byte section.
    assert_refused(
        &broken(9, 8, &16u64.to_le_bytes()),
        &["symbol 9 (axpy): value 16 + size 512 is past the end of section 13 (.text.axpy)"],
    );
    assert_refused(
        &broken(9, 16, &u64::MAX.to_le_bytes()),
        &["symbol 9 (axpy): value 0"],
    );
    assert_refused(&broken(0, 0, &[1]), &["symbol 0 is not all zeros"]);
    assert_refused(
        &broken(9, 4, &[0x32]),
        &["symbol 9 (axpy): binding 3 and type 2 (st_info): one of them is reserved"],
    );
    assert_refused(&broken(9, 4, &[0x18]), &["binding 1 and type 8"]);
    assert_eq!(
        check(&broken(9, 4, &[0xd2])),
        Ok(BlobKind::Cubin),
        "a processor binding"
    );
    // Undefined, absolute and common symbols are fine.
    for shndx in [0u16, 0xfff1, 0xfff2] {
        assert_eq!(
            check(&broken(9, 6, &shndx.to_le_bytes())),
            Ok(BlobKind::Cubin)
        );
    }
}

#[test]
fn relocations_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let rela = real.data(".rela.debug_frame");
    let broken = |at: usize, bytes: &[u8]| {
        let mut image = real.clone();
        image.set(at, bytes);
        image.b
    };
    // Entry 0: offset 0xac, symbol 10 (scale), type 2 (R_CUDA_64) into the 208-byte .debug_frame.
    assert_eq!(real.u64(rela + 8), (10 << 32) | 2);
    assert_refused(
        &broken(rela + 12, &13u32.to_le_bytes()),
        &[
            "section 12 (.rela.debug_frame): relocation 0: symbol index 13 is past the 13 symbols of section 3 (.symtab)",
        ],
    );
    assert_refused(
        &broken(rela, &201u64.to_le_bytes()),
        &[
            "relocation 0: offset 201 + 8 bytes is past the end of section 4 (.debug_frame) (208 bytes)",
        ],
    );
    assert_eq!(
        check(&broken(rela, &200u64.to_le_bytes())),
        Ok(BlobKind::Cubin)
    );
    assert_refused(
        &broken(rela + 8, &0x5000u32.to_le_bytes()),
        &["type 0x5000", "R_CUDA"],
    );
    assert_eq!(
        check(&broken(rela + 8, &0x1_0001u32.to_le_bytes())),
        Ok(BlobKind::Cubin),
        "an R_MERCURY type"
    );
    let field = |name, field, bytes: &[u8]| broken(real.field(name, field), bytes);
    assert_refused(
        &field(".rela.debug_frame", SH_INFO, &0u32.to_le_bytes()),
        &["sh_info 0"],
    );
    assert_refused(
        &field(".rela.debug_frame", SH_LINK, &2u32.to_le_bytes()),
        &["links to section 2 (.strtab), which is not a symbol table"],
    );
    assert_refused(
        &field(".rela.debug_frame", SH_ENTSIZE, &16u64.to_le_bytes()),
        &["entry size 16", "RELA"],
    );
    assert_refused(
        &field(".rela.debug_frame", SH_TYPE, &9u32.to_le_bytes()),
        &["entry size 24", "REL table has whole 16-byte entries"],
    );
}

#[test]
fn nv_info_records_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let broken = |at: usize, bytes: &[u8]| {
        let mut image = real.clone();
        image.set(at, bytes);
        image.b
    };
    let info = real.data(".nv.info");
    let axpy = real.data(".nv.info.axpy");
    assert_refused(
        &broken(axpy, &[7]),
        &["section 9 (.nv.info.axpy): the attribute record at offset 0 has format 0x07"],
    );
    // The first record of .nv.info.axpy is CUDA_API_VERSION, 4 bytes of value.
    assert_refused(
        &broken(axpy + 2, &0x100u16.to_le_bytes()),
        &[
            "record at offset 0 (attribute 0x37): its 256-byte value is past the end of the 120-byte section",
        ],
    );
    // REGCOUNT in the global .nv.info: the first word is a symbol.
    let regcount = real.record(".nv.info", 0x2f);
    assert_eq!(regcount, info);
    assert_refused(
        &broken(regcount + 4, &13u32.to_le_bytes()),
        &[
            "section 7 (.nv.info): the attribute record at offset 0 (attribute 0x2f): symbol index 13 is past the 13 symbols",
        ],
    );
    for attribute in [0x11, 0x12] {
        let at = real.record(".nv.info", attribute);
        assert_refused(&broken(at + 4, &99u32.to_le_bytes()), &["symbol index 99"]);
    }
    // PARAM_CBANK: symbol 11 (.nv.constant0.axpy, 552 bytes), parameters at 0x210, 24 bytes.
    let cbank = real.record(".nv.info.axpy", 0x0a);
    assert_eq!(
        (real.u32(cbank + 4), real.u32(cbank + 8)),
        (11, 0x0018_0210)
    );
    assert_refused(
        &broken(cbank + 8, &0x0019_0210u32.to_le_bytes()),
        &[
            "parameters at offset 528 + size 25 are past the end of section 16 (.nv.constant0.axpy) (552 bytes)",
        ],
    );
    assert_refused(
        &broken(cbank + 4, &40u32.to_le_bytes()),
        &["symbol index 40"],
    );
    // KPARAM_INFO: ordinal and placement within CBANK_PARAM_SIZE (24 bytes for axpy).
    let kparam = real.record(".nv.info.axpy", 0x17);
    assert_refused(
        &broken(kparam + 8, &4u16.to_le_bytes()),
        &["parameter ordinal 4, but the kernel has 4 parameters"],
    );
    assert_refused(
        &broken(kparam + 10, &21u16.to_le_bytes()),
        &["parameter 3 at offset 21 + size 4 is past the kernel's 24 bytes of parameters"],
    );
    // EXIT_INSTR_OFFSETS: inside the kernel's 512 bytes of code.
    let exits = real.record(".nv.info.axpy", 0x1c);
    assert_refused(
        &broken(exits + 4, &512u32.to_le_bytes()),
        &["instruction offset 512 is past the end of section 13 (.text.axpy) (512 bytes)"],
    );
    // .nv.compat has records of the same form.
    assert_refused(
        &broken(real.data(".nv.compat"), &[9]),
        &["section 8 (.nv.compat)", "format 0x09"],
    );
    // A truncated record header at the end of a section.
    assert_refused(
        &broken(
            real.field(".nv.info.scale", SH_SIZE),
            &(0x68 - 2u64).to_le_bytes(),
        ),
        &[
            "section 10 (.nv.info.scale)",
            "past the end of the 102-byte section",
        ],
    );
}

#[test]
fn cuda_sections_linking_to_symbols_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let broken = |at: usize, bytes: &[u8]| {
        let mut image = real.clone();
        image.set(at, bytes);
        image.b
    };
    assert_refused(
        &broken(real.field(".text.scale", SH_INFO), &13u32.to_le_bytes()),
        &["section 14 (.text.scale): sh_info 0xd names symbol 13, past the 13 symbols"],
    );
    // Older toolchains keep the register count in the high byte.
    assert_eq!(
        check(&broken(
            real.field(".text.scale", SH_INFO),
            &0x2000_000au32.to_le_bytes()
        )),
        Ok(BlobKind::Cubin)
    );
    assert_refused(
        &broken(real.field(".nv.info", SH_LINK), &2u32.to_le_bytes()),
        &["section 7 (.nv.info): links to section 2 (.strtab), which is not a symbol table"],
    );
    let graph = real.data(".nv.callgraph");
    assert_refused(
        &broken(graph, &13u32.to_le_bytes()),
        &["section 11 (.nv.callgraph): entry 0: symbol index 13 is past the 13 symbols"],
    );
    assert_refused(
        &broken(real.field(".nv.callgraph", SH_ENTSIZE), &4u64.to_le_bytes()),
        &["whole 8-byte entries"],
    );
}

#[test]
fn notes_are_checked() {
    let real = Image::new(demo_cubin("elementwise"));
    let note = real.data(".note.nv.cuinfo");
    let mut image = real.clone();
    image.set(note, &1000u32.to_le_bytes());
    assert_refused(
        &image.b,
        &[
            "section 6 (.note.nv.cuinfo): the note at offset 0 runs past the end of the 32-byte section",
        ],
    );
    let mut image = real.clone();
    image.set(note + 4, &u32::MAX.to_le_bytes());
    assert_refused(
        &image.b,
        &["section 6 (.note.nv.cuinfo): the note at offset 0"],
    );
}

/// AMD GPU code objects get the generic checks only, and are not refused for their machine.
#[test]
fn amd_gpu_elf_gets_the_generic_checks() {
    let mut amd = Image::new(demo_cubin("elementwise"));
    amd.set(18, &224u16.to_le_bytes());
    assert_eq!(check(&amd.b), Ok(BlobKind::Cubin));
    // NVIDIA's records are not AMD's business...
    let mut records = amd.clone();
    records.set(amd.data(".nv.info.axpy"), &[7]);
    assert_eq!(check(&records.b), Ok(BlobKind::Cubin));
    // ...but every generic link, offset and index is.
    let mut link = amd.clone();
    link.set(amd.field(".symtab", SH_LINK), &99u32.to_le_bytes());
    assert_refused(&link.b, &["sh_link 99"]);
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

/// The committed fatbin with `edit` applied to its ELF entry's payload.
fn with_fatbin_elf(elf: &[u8]) -> Vec<u8> {
    let (at, size) = fatbin_entry(ELEMENTWISE_FATBIN, 1);
    let mut b = ELEMENTWISE_FATBIN.to_vec();
    let payload = at + 64;
    assert_eq!(size, elf.len());
    b[payload..payload + size].copy_from_slice(elf);
    b
}

/// Offset and payload size of fatbin entry `n`.
fn fatbin_entry(b: &[u8], n: usize) -> (usize, usize) {
    let image = Image::new(b);
    let mut at = usize::from(image.u16(6));
    for _ in 0..n {
        at += image.u32(at + 4) as usize + image.u64(at + 8) as usize;
    }
    (at, image.u64(at + 8) as usize)
}

#[test]
fn fatbin_entries_are_checked() {
    let real = Image::new(ELEMENTWISE_FATBIN);
    let (ptx, elf) = (fatbin_entry(&real.b, 0).0, fatbin_entry(&real.b, 1).0);
    assert_eq!((ptx, elf), (16, 560));
    // Entry 0: zstd-compressed PTX, 80-byte header, 464 bytes (458 compressed, 1426 plain).
    assert_eq!(
        (real.u16(ptx), real.u32(ptx + 4), real.u64(ptx + 8)),
        (1, 80, 464)
    );
    assert_eq!(
        (real.u32(ptx + 16), real.u64(ptx + 40), real.u64(ptx + 56)),
        (458, 0x8011, 1426)
    );
    // Entry 1: a plain sm_90 ELF, 64-byte header, the 5,600-byte cubin.
    assert_eq!(
        (
            real.u16(elf),
            real.u32(elf + 4),
            real.u64(elf + 8),
            real.u32(elf + 28)
        ),
        (2, 64, 5600, 90)
    );
    assert_eq!(&real.b[elf + 64..], demo_cubin("elementwise"));
    let broken = |at: usize, bytes: &[u8]| {
        let mut image = real.clone();
        image.set(at, bytes);
        image.b
    };
    assert_refused(&broken(4, &[2]), &["fatbin version 2"]);
    assert_refused(&broken(8, &0u64.to_le_bytes()), &["no entries"]);
    assert_refused(&real.b[..real.b.len() - 1], &["truncated fatbin"]);
    assert_refused(
        &broken(elf, &[7]),
        &["fatbin entry 1 (unknown kind sm_90 at offset 560): kind 7"],
    );
    assert_refused(
        &broken(elf + 4, &[32]),
        &["malformed fatbin: fatbin entry 1", "32-byte header"],
    );
    assert_refused(
        &broken(elf + 8, &5601u64.to_le_bytes()),
        &["malformed fatbin", "5601-byte payload"],
    );
    assert_refused(
        &broken(ptx + 8, &456u64.to_le_bytes()),
        &["compressed size 458 does not fit the 456-byte payload"],
    );
    assert_refused(
        &broken(elf + 32, &[0x70, 0x17, 0, 0, 8]),
        &["its name at offset 6000 + size 8 is outside the 5,664-byte entry"],
    );
    // The ELF inside is checked as a cubin, and refusals say where it is.
    let mut cubin = Image::new(demo_cubin("elementwise"));
    cubin.set(cubin.field(".symtab", SH_LINK), &99u32.to_le_bytes());
    assert_refused(
        &with_fatbin_elf(&cubin.b),
        &["fatbin entry 1 (ELF sm_90 at offset 560): section 3 (.symtab): sh_link 99"],
    );
    let mut cubin = Image::new(demo_cubin("elementwise"));
    cubin.set(
        cubin.field(".nv.info.scale", SH_OFFSET),
        &5500u64.to_le_bytes(),
    );
    assert_refused(
        &with_fatbin_elf(&cubin.b),
        &["past the end of the 5,600-byte ELF payload"],
    );
    // Compressed entries: the container only.
    assert_refused(
        &broken(ptx + 16, &0u32.to_le_bytes()),
        &["fatbin entry 0 (PTX sm_90 at offset 16): compressed size 0"],
    );
    assert_refused(
        &broken(ptx + 16, &465u32.to_le_bytes()),
        &["compressed size 465"],
    );
    assert_refused(
        &broken(ptx + 56, &0u64.to_le_bytes()),
        &["no uncompressed size"],
    );
    assert_refused(
        &broken(ptx + 56, &1427u64.to_le_bytes()),
        &["the zstd frame holds 1,426 bytes, the entry declares 1,427 uncompressed"],
    );
    assert_refused(
        &broken(ptx + 80, &[0]),
        &["does not start with a zstd frame header"],
    );
    assert_refused(&broken(ptx + 41, &[0xa0]), &["more than one compression"]);
    // NVIDIA's own compression: the container only.
    assert_eq!(check(&broken(ptx + 41, &[0x20])), Ok(BlobKind::Fatbin));
    // The compressed bytes after the frame header are the driver's to refuse.
    assert_eq!(check(&broken(ptx + 100, &[0x55])), Ok(BlobKind::Fatbin));
}

#[test]
fn uncompressed_ptx_entries_must_end_inside_the_payload() {
    let ptx = b".version 8.0\n.target sm_90\n.address_size 64\n\0\0\0\0";
    let mut b = fatbin::MAGIC.to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(&(64 + ptx.len() as u64).to_le_bytes());
    let mut entry = [0u8; 64];
    entry[0] = 1;
    entry[4] = 64;
    entry[8..16].copy_from_slice(&(ptx.len() as u64).to_le_bytes());
    entry[28] = 90;
    b.extend_from_slice(&entry);
    b.extend_from_slice(ptx);
    assert_eq!(check(&b), Ok(BlobKind::Fatbin));
    assert_eq!(code_targets(&b), "compute_90 PTX");
    let len = b.len();
    b[len - 4..].copy_from_slice(b"    ");
    assert_refused(
        &b,
        &[
            "fatbin entry 0 (PTX sm_90 at offset 16): the 48-byte PTX payload has no terminating NUL",
        ],
    );
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
    let mut amd = cubin.to_vec();
    amd[18..20].copy_from_slice(&224u16.to_le_bytes());
    assert_eq!(check(&bundle(&amd)), Ok(BlobKind::OffloadBundle));
    // Non-ELF code objects (bitcode, PTX) go to the driver as they are.
    assert_eq!(check(&bundle(b"BC\xc0\xde")), Ok(BlobKind::OffloadBundle));

    let mut bad = Image::new(cubin);
    bad.set(bad.field(".symtab", SH_LINK), &99u32.to_le_bytes());
    assert_refused(
        &bundle(&bad.b),
        &[
            "offload bundle entry 1 (cuda-nvptx64-nvidia-cuda-sm_90): section 3 (.symtab): sh_link 99",
        ],
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

#[test]
fn truncations_are_refused_as_truncated() {
    for blob in [
        demo_cubin("elementwise"),
        demo_cubin("noop"),
        ELEMENTWISE_FATBIN,
    ] {
        for cut in [10, 63, 64, blob.len() / 2, blob.len() - 1] {
            let reason = refusal(&blob[..cut]);
            assert!(reason.contains("truncated"), "cut at {cut}: {reason}");
        }
    }
}
