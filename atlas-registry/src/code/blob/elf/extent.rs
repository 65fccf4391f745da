//! How long a cubin is by its own headers, read from its first bytes: where its header tables,
//! sections and segments end. A compressed fatbin entry declares how many bytes it decompresses
//! to, and that many are allocated to check it; bytes past the end of everything its cubin's
//! headers describe are code of nothing, and a declared size that reaches far past it is how a
//! few kilobytes of zstd make gigabytes (a real cubin followed by zeros). Its first bytes are
//! enough to tell: the ELF header says where the header tables are, and the section header table
//! where each section is. [`compressed`](super::super::compressed) decompresses that much
//! first, and refuses a declared size past the end before it allocates the rest.
//!
//! NVIDIA's toolchains write the tables either after the sections (the program header table
//! last: the tables end where the file ends) or right after the ELF header (the sections follow
//! them); in the 23,830 cubins of NVIDIA's CUDA 12 and 13 libraries (cuBLAS, cuBLASLt, cuFFT,
//! cuSPARSE), not one byte lies past that end.

use super::{HEADER_SIZE, MAGIC, PROGRAM_HEADER_SIZE, SECTION_HEADER_SIZE, occupies_file};
use crate::code::blob::read::{bytes_at, u8_at, u16_at, u32_at, u64_at};
use object::elf::{ELFCLASS64, ELFDATA2LSB};

/// What the first bytes of a cubin tell of its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::code::blob) enum Extent {
    /// Its headers describe its first this many bytes, and nothing past them: the furthest end
    /// of its ELF header, header tables, sections that occupy file bytes, and segments' file
    /// images (an end past the largest `u64` is read as the largest).
    Ends(u64),
    /// Its first this many bytes are needed to tell: its header tables end there.
    Needs(u64),
    /// They are not the header of a 64-bit little-endian ELF file with ELF64 table entries: what
    /// follows is not read as a cubin's.
    Unreadable,
}

/// What `head`, the first bytes of a cubin (or all of it), tells of its length.
pub(in crate::code::blob) fn extent(head: &[u8]) -> Extent {
    let Some(header) = bytes_at(head, 0, HEADER_SIZE) else {
        return Extent::Needs(HEADER_SIZE);
    };
    let identified = header.starts_with(MAGIC)
        && u8_at(header, 4) == Some(ELFCLASS64)
        && u8_at(header, 5) == Some(ELFDATA2LSB);
    let half = |at| u64::from(u16_at(header, at).unwrap_or(0));
    let word = |at| u64_at(header, at).unwrap_or(0);
    // (offset, count) of each table, whose entries must be of ELF64's sizes to be read; a table
    // of no entries is not there (e_shnum 0 with e_shoff set, extended numbering, is refused by
    // the ELF check, which cubins never need).
    let programs = (word(32), half(56), half(54), PROGRAM_HEADER_SIZE);
    let sections = (word(40), half(60), half(58), SECTION_HEADER_SIZE);
    let mut tables_end = HEADER_SIZE;
    for (offset, count, entry_size, elf64) in [programs, sections] {
        if count == 0 {
            continue;
        }
        let end = offset.checked_add(count * elf64);
        match end {
            Some(end) if identified && entry_size == elf64 => tables_end = tables_end.max(end),
            _ => return Extent::Unreadable,
        }
    }
    if (head.len() as u64) < tables_end {
        return Extent::Needs(tables_end);
    }
    let entries = |(offset, count, _, size): (u64, u64, u64, u64)| {
        (0..count).filter_map(move |i| bytes_at(head, offset + i * size, size))
    };
    let section_ends = entries(sections)
        .filter(|s| occupies_file(u32_at(s, 4).unwrap_or(0), true))
        .map(|s| {
            u64_at(s, 24)
                .unwrap_or(0)
                .saturating_add(u64_at(s, 32).unwrap_or(0))
        });
    let segment_ends = entries(programs).map(|p| {
        u64_at(p, 8)
            .unwrap_or(0)
            .saturating_add(u64_at(p, 32).unwrap_or(0))
    });
    Extent::Ends(section_ends.chain(segment_ends).fold(tables_end, u64::max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cubin_ends_where_its_headers_say() {
        for &sm in atlas_kernels::CUBIN_ARCHS {
            for (name, cubin) in atlas_kernels::cubin_for_model("demo", sm).unwrap() {
                let len = cubin.len() as u64;
                assert_eq!(extent(cubin), Extent::Ends(len), "{name} sm_{sm}");
                // Followed by zeros, it ends where it did.
                let longer = [cubin, &[0; 4096][..]].concat();
                assert_eq!(extent(&longer), Extent::Ends(len), "{name} sm_{sm}");
                // Its first 64 bytes say where the tables end; nvcc's end the file.
                assert_eq!(extent(&cubin[..64]), Extent::Needs(len), "{name} sm_{sm}");
                assert_eq!(extent(&cubin[..10]), Extent::Needs(64));
            }
        }
    }

    #[test]
    fn headers_that_cannot_be_read_say_so() {
        let cubin = atlas_kernels::cubin_for_model("demo", 90).unwrap()[0].1;
        let with = |at: usize, bytes: &[u8]| {
            let mut b = cubin.to_vec();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            b
        };
        assert_eq!(extent(&with(0, b"\x7fELG")), Extent::Unreadable);
        assert_eq!(extent(&with(4, &[1])), Extent::Unreadable);
        assert_eq!(extent(&with(5, &[2])), Extent::Unreadable);
        assert_eq!(extent(&with(58, &[40, 0])), Extent::Unreadable);
        assert_eq!(
            extent(&with(40, &u64::MAX.to_le_bytes())),
            Extent::Unreadable
        );
        // A section that reaches past the largest offset ends there.
        let shoff = u64::from_le_bytes(cubin[40..48].try_into().unwrap()) as usize;
        let far = with(shoff + 64 + 24, &(u64::MAX - 1).to_le_bytes());
        assert_eq!(extent(&far), Extent::Ends(u64::MAX));
    }
}
