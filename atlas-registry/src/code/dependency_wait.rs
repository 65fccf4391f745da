//! Whether a kernel's code waits for the grid it depends on (PTX `griddepcontrol.wait`, CUDA C++
//! `cudaGridDependencySynchronize()`), read from the blob: what a programmatic dependent launch
//! of a kernel that never waits is refused for.
//!
//! A launch with programmatic stream serialization (or after a programmatic event) may start
//! before its predecessor has finished. Only the wait makes the predecessor's writes visible; a
//! kernel that never runs it reads data that may not be written yet.
//!
//! What is read, and how far it can be trusted:
//!
//! - PTX: each `.entry` body and every `.func` it calls, transitively. A kernel waits when one of
//!   them holds `griddepcontrol.wait` (any `griddepcontrol` other than `.launch_dependents` is
//!   taken for a wait). It is unknown when it may reach a function whose body is not in the text
//!   (`.extern .func`, one resolved when the driver links the module) or calls through a pointer
//!   (`call` of a register), or when the text cannot be read. Comments and string literals are
//!   skipped ([`ptx_lexer`](crate::code::ptx_lexer), the layout reader's lexer). PTX for a target
//!   older than `sm_90` cannot hold the wait: its kernels never wait,
//!   even when the driver compiles them for a newer GPU. A text that holds neither
//!   `griddepcontrol` nor `call` is answered without reading its bodies.
//! - ELF cubin (SASS): `ptxas` turns the wait into one instruction, `ACQBULK` (opcode `0x82e` in
//!   the low 12 bits of a 16-byte instruction; `griddepcontrol.launch_dependents` is `PREEXIT`,
//!   `0x82d`), the same in the SASS of sm_90, sm_90a, sm_100, sm_100a, sm_101, sm_103, sm_120 and
//!   sm_121 (ptxas 12.9). No `.nv.info` record marks it: the records of a kernel with and without
//!   the wait are the same but for its exit offsets. A kernel waits when its own code section
//!   holds the instruction (ptxas puts the functions a kernel calls into it, or beside it); it is
//!   unknown when another code section, of no kernel, holds one (a function it may call), when
//!   the cubin is relocatable (code linked later), or built for an architecture whose encoding
//!   is not listed above.
//! - Fatbin: the driver loads one of the entries it may load for the device, and which is not
//!   known here; a kernel never waits (or waits) only when every such entry says so, else it is
//!   unknown. A compressed entry is read from its decompression.
//! - Anything else (an offload bundle, an AMD code object, unreadable bytes): unknown.
//!
//! Unknown is never refused. What is not seen at all: whether the wait is reached on every path
//! (a wait behind a branch counts as a wait), and what a predecessor in another module or process
//! expects.

use std::collections::{HashMap, HashSet};

use object::elf;

use crate::code::blob::elf::{Elf, Machines, c_string};
use crate::code::blob::sm_arch;
use crate::code::ptx_lexer::{Lexer, Token};

/// Whether a kernel's code waits for the grid it depends on before it reads that grid's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DependencyWait {
    /// The code holds the wait (`griddepcontrol.wait`), in the kernel or a function it calls.
    Waits,
    /// The code never waits: a programmatic dependent launch of it is refused unless the launch
    /// says the kernel reads nothing its predecessor writes
    /// ([`LaunchAttributes::programmatic_without_wait`](crate::LaunchAttributes::programmatic_without_wait)).
    NeverWaits,
    /// Atlas cannot tell (see [`kernel_dependency_waits`]); launched as asked.
    Unknown,
}

impl DependencyWait {
    /// The value as one byte, never 0 (0 is "not read yet" where it is cached).
    pub(crate) const fn to_byte(self) -> u8 {
        match self {
            Self::Waits => 1,
            Self::NeverWaits => 2,
            Self::Unknown => 3,
        }
    }

    /// The value of [`to_byte`](Self::to_byte); `None` for 0 (or any other byte).
    pub(crate) const fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(Self::Waits),
            2 => Some(Self::NeverWaits),
            3 => Some(Self::Unknown),
            _ => None,
        }
    }
}

/// What one piece of code (a PTX text, a cubin) says of its kernels' waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CodeWaits {
    /// No kernel of it waits (a PTX text without any `griddepcontrol` or `call`).
    NoneWait,
    /// Each kernel it lists, with what is known; a kernel not listed is unknown.
    Kernels(HashMap<String, DependencyWait>),
}

impl CodeWaits {
    /// Nothing known.
    pub(crate) fn unknown() -> Self {
        Self::Kernels(HashMap::new())
    }

    /// What a blob whose driver-loaded code is one of `pieces` says: per kernel, what every piece
    /// agrees on, else unknown. No piece: nothing known.
    pub(crate) fn agreed(pieces: impl IntoIterator<Item = CodeWaits>) -> Self {
        let mut pieces = pieces.into_iter();
        let Some(mut agreed) = pieces.next() else {
            return Self::unknown();
        };
        for next in pieces {
            agreed = match (agreed, next) {
                (Self::NoneWait, Self::NoneWait) => Self::NoneWait,
                (Self::NoneWait, Self::Kernels(k)) | (Self::Kernels(k), Self::NoneWait) => {
                    Self::Kernels(
                        k.into_iter()
                            .filter(|(_, w)| *w == DependencyWait::NeverWaits)
                            .collect(),
                    )
                }
                (Self::Kernels(mut a), Self::Kernels(b)) => {
                    a.retain(|name, wait| b.get(name) == Some(wait));
                    Self::Kernels(a)
                }
            };
        }
        agreed
    }

    /// What is known of kernel `name`.
    pub(crate) fn of(&self, name: &str) -> DependencyWait {
        match self {
            Self::NoneWait => DependencyWait::NeverWaits,
            Self::Kernels(kernels) => kernels
                .get(name)
                .copied()
                .unwrap_or(DependencyWait::Unknown),
        }
    }

    /// Bytes held on the heap, roughly (names and table slots).
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Self::NoneWait => 0,
            Self::Kernels(kernels) => {
                let slot = std::mem::size_of::<(String, DependencyWait)>() + 1;
                kernels.capacity() * slot + kernels.keys().map(String::capacity).sum::<usize>()
            }
        }
    }
}

/// Every kernel of a PTX text or ELF cubin whose wait Atlas can tell, with it
/// ([`DependencyWait::Waits`] or [`DependencyWait::NeverWaits`]); a kernel not listed is
/// [`DependencyWait::Unknown`]. See the module's documentation for what is read. Fatbins and
/// other containers list nothing: Atlas reads their entries one by one where it loads them.
pub fn kernel_dependency_waits(blob: &[u8]) -> Vec<(String, DependencyWait)> {
    let read = if blob.starts_with(b"\x7fELF") {
        cubin_waits(blob)
    } else {
        // Every kernel named, not the shortcut of a text without waits or calls.
        read_ptx(ptx_text(blob)).unwrap_or_else(CodeWaits::unknown)
    };
    let mut listed: Vec<(String, DependencyWait)> = match read {
        CodeWaits::NoneWait => Vec::new(),
        CodeWaits::Kernels(kernels) => kernels
            .into_iter()
            .filter(|(_, wait)| *wait != DependencyWait::Unknown)
            .collect(),
    };
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    listed
}

/// What a PTX text or an ELF cubin says of its kernels' waits; anything else says nothing.
pub(crate) fn code_waits(code: &[u8]) -> CodeWaits {
    if code.starts_with(b"\x7fELF") {
        cubin_waits(code)
    } else {
        ptx_waits(code)
    }
}

// ---------------------------------------------------------------------------------------------
// PTX
// ---------------------------------------------------------------------------------------------

/// What one function body does that matters here.
#[derive(Debug, Default)]
struct Body<'t> {
    waits: bool,
    /// Calls through a pointer.
    indirect: bool,
    /// Functions called by name.
    calls: Vec<&'t str>,
}

/// The waits of a PTX text's kernels.
fn ptx_waits(ptx: &[u8]) -> CodeWaits {
    let text = ptx_text(ptx);
    if !holds_any(text, &["griddepcontrol", "call"]) {
        return CodeWaits::NoneWait;
    }
    read_ptx(text).unwrap_or_else(CodeWaits::unknown)
}

/// The text the driver reads: up to the first NUL.
fn ptx_text(ptx: &[u8]) -> &[u8] {
    ptx.iter()
        .position(|&b| b == 0)
        .map_or(ptx, |end| &ptx[..end])
}

/// Whether `text` holds any of `words` anywhere (comments included): the standard library's
/// substring search where the text is UTF-8 (all PTX a load takes), several times faster than
/// comparing every window.
fn holds_any(text: &[u8], words: &[&str]) -> bool {
    match std::str::from_utf8(text) {
        Ok(text) => words.iter().any(|word| text.contains(word)),
        Err(_) => words
            .iter()
            .any(|word| text.windows(word.len()).any(|w| w == word.as_bytes())),
    }
}

/// The next token, `None` where the lexer cannot go on (the text is then not understood).
fn next<'t>(lexer: &mut Lexer<'t>) -> Option<Token<'t>> {
    lexer.next().ok().map(|(token, _)| token)
}

/// Reads every `.entry` and `.func` of `text`; `None` when the text is not understood.
fn read_ptx(text: &[u8]) -> Option<CodeWaits> {
    let mut lexer = Lexer::new(std::str::from_utf8(text).ok()?);
    let mut entries: Vec<(&str, Body<'_>)> = Vec::new();
    // Each function defined here; `None` for a name defined twice (unknown).
    let mut functions: HashMap<&str, Option<Body<'_>>> = HashMap::new();
    loop {
        let (token, line) = lexer.next().ok()?;
        match token {
            Token::End => break,
            Token::Punct('{') => lexer.skip_block(line).ok()?,
            Token::Punct('}') => return None,
            Token::Directive(".entry") => {
                let Token::Word(name) = next(&mut lexer)? else {
                    return None;
                };
                if let Some(body) = definition(&mut lexer)? {
                    entries.push((name, body));
                }
            }
            Token::Directive(".func") => {
                // An optional return parameter list comes before the name.
                let mut token = next(&mut lexer)?;
                if token == Token::Punct('(') {
                    skip_parens(&mut lexer)?;
                    token = next(&mut lexer)?;
                }
                let Token::Word(name) = token else {
                    return None;
                };
                if let Some(body) = definition(&mut lexer)? {
                    functions
                        .entry(name)
                        .and_modify(|slot| *slot = None)
                        .or_insert(Some(body));
                }
            }
            _ => {}
        }
    }
    let mut kernels = HashMap::with_capacity(entries.len());
    for (name, body) in &entries {
        let wait = reached(body, &functions);
        kernels
            .entry((*name).to_owned())
            .and_modify(|w| *w = DependencyWait::Unknown)
            .or_insert(wait);
    }
    Some(CodeWaits::Kernels(kernels))
}

/// What `entry` reaches: a wait in it or in any function it calls (transitively), else unknown
/// when it reaches a call through a pointer or a function not defined here, else never.
fn reached(entry: &Body<'_>, functions: &HashMap<&str, Option<Body<'_>>>) -> DependencyWait {
    let mut unknown = false;
    let mut seen: HashSet<&str> = HashSet::new();
    let mut stack: Vec<&Body<'_>> = vec![entry];
    while let Some(body) = stack.pop() {
        if body.waits {
            return DependencyWait::Waits;
        }
        unknown |= body.indirect;
        for &callee in &body.calls {
            if !seen.insert(callee) {
                continue;
            }
            match functions.get(callee) {
                Some(Some(body)) => stack.push(body),
                _ => unknown = true,
            }
        }
    }
    if unknown {
        DependencyWait::Unknown
    } else {
        DependencyWait::NeverWaits
    }
}

/// After a function's name: its parameters and directives, then its body (read) or `;` (a
/// declaration: `Some(None)`); `None` when not understood.
fn definition<'t>(lexer: &mut Lexer<'t>) -> Option<Option<Body<'t>>> {
    loop {
        match next(lexer)? {
            Token::Punct('(') => skip_parens(lexer)?,
            Token::Punct('{') => return body(lexer).map(Some),
            Token::Punct(';') => return Some(None),
            Token::End | Token::Punct('}') => return None,
            _ => {}
        }
    }
}

/// Skips to the `)` that closes a `(` already read.
fn skip_parens(lexer: &mut Lexer<'_>) -> Option<()> {
    let mut depth = 1usize;
    loop {
        match next(lexer)? {
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => {
                depth -= 1;
                if depth == 0 {
                    return Some(());
                }
            }
            Token::End | Token::Punct('{' | '}' | ';') => return None,
            _ => {}
        }
    }
}

/// Reads a body whose `{` was read, to its `}`.
fn body<'t>(lexer: &mut Lexer<'t>) -> Option<Body<'t>> {
    let mut body = Body::default();
    let mut depth = 1usize;
    loop {
        match next(lexer)? {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(body);
                }
            }
            Token::End => return None,
            // `griddepcontrol` in any form but `.launch_dependents` is taken for a wait.
            Token::Word("griddepcontrol")
                if lexer.peek().ok()? != Token::Directive(".launch_dependents") =>
            {
                body.waits = true;
            }
            Token::Word("call") => call(lexer, &mut body)?,
            _ => {}
        }
    }
}

/// Reads a `call` (the word read) to its `;`: `call{.uni} (returns), target, (arguments)...;`.
/// The target is the first name outside parentheses; a register (`%rd1`) is a call through a
/// pointer.
fn call<'t>(lexer: &mut Lexer<'t>, body: &mut Body<'t>) -> Option<()> {
    let mut depth = 0usize;
    let mut target = None;
    loop {
        match next(lexer)? {
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => depth = depth.checked_sub(1)?,
            Token::Punct(';') => break,
            Token::End | Token::Punct('{' | '}') => return None,
            Token::Word(word) if depth == 0 && target.is_none() => target = Some(word),
            _ => {}
        }
    }
    match target? {
        register if register.starts_with('%') => body.indirect = true,
        name => body.calls.push(name),
    }
    Some(())
}

// ---------------------------------------------------------------------------------------------
// ELF cubins
// ---------------------------------------------------------------------------------------------

/// The architectures whose SASS encodes `griddepcontrol.wait` as [`ACQBULK`], as read from
/// ptxas 12.9's output (sm_90a and sm_100a share their base's `e_flags` SM number).
const SASS_WITH_ACQBULK: &[u32] = &[90, 100, 101, 103, 120, 121];

/// The low 12 bits of `ACQBULK`, the SASS of `griddepcontrol.wait`.
const ACQBULK: u64 = 0x82e;

/// SASS instructions of these architectures take 16 bytes, the opcode in the low bits of the
/// first 8.
const INSTRUCTION_BYTES: usize = 16;

/// `st_other` of a kernel (`STO_CUDA_ENTRY`).
const STO_CUDA_ENTRY: u8 = 0x10;

/// Whether `code` (a code section) holds `ACQBULK`; `None` when it is not whole instructions.
fn holds_acqbulk(code: &[u8]) -> Option<bool> {
    if !code.len().is_multiple_of(INSTRUCTION_BYTES) {
        return None;
    }
    Some(code.chunks_exact(INSTRUCTION_BYTES).any(|instruction| {
        let mut low = [0u8; 8];
        low.copy_from_slice(&instruction[..8]);
        u64::from_le_bytes(low) & 0xfff == ACQBULK
    }))
}

/// The waits of a cubin's kernels; nothing known of a cubin that is not read.
fn cubin_waits(cubin: &[u8]) -> CodeWaits {
    read_cubin(cubin).map_or_else(CodeWaits::unknown, CodeWaits::Kernels)
}

fn read_cubin(cubin: &[u8]) -> Option<HashMap<String, DependencyWait>> {
    if !SASS_WITH_ACQBULK.contains(&sm_arch(cubin)?) {
        return None;
    }
    let e_type = u16::from_le_bytes([*cubin.get(16)?, *cubin.get(17)?]);
    if e_type != elf::ET_EXEC {
        return None;
    }
    let image = Elf::parse(cubin, "cubin", Machines::Cuda).ok()?;
    let (symbols, strings) = image.symbol_table().ok()??;
    let mut kernels: Vec<(&[u8], u16)> = Vec::new();
    for symbol in symbols.iter() {
        if symbol.kind == elf::STT_FUNC
            && symbol.other & STO_CUDA_ENTRY != 0
            && symbol.shndx != elf::SHN_UNDEF
        {
            kernels.push((c_string(strings, symbol.name)?, symbol.shndx));
        }
    }
    let kernel_sections: HashSet<u16> = kernels.iter().map(|&(_, shndx)| shndx).collect();
    // Per code section: whether it holds the wait.
    let mut waits: HashMap<u32, bool> = HashMap::new();
    let mut other_code_waits = false;
    for (index, section) in image.sections() {
        let name = image.section_name(index, &section).ok()?;
        if !name.starts_with(b".text.") {
            continue;
        }
        let holds = holds_acqbulk(image.data(index, &section).ok()?)?;
        let of_kernel = u16::try_from(index).is_ok_and(|i| kernel_sections.contains(&i));
        if of_kernel {
            waits.insert(index, holds);
        } else {
            other_code_waits |= holds;
        }
    }
    let mut known = HashMap::with_capacity(kernels.len());
    for (name, shndx) in kernels {
        let name = std::str::from_utf8(name).ok()?.to_owned();
        let wait = match waits.get(&u32::from(shndx)) {
            Some(true) => DependencyWait::Waits,
            Some(false) if !other_code_waits => DependencyWait::NeverWaits,
            _ => DependencyWait::Unknown,
        };
        known
            .entry(name)
            .and_modify(|w| *w = DependencyWait::Unknown)
            .or_insert(wait);
    }
    Some(known)
}

#[cfg(test)]
mod tests {
    use super::*;
    use DependencyWait::{NeverWaits, Unknown, Waits};

    const HEAD: &str = ".version 7.8\n.target sm_90\n.address_size 64\n";

    fn waits(body: &str) -> Vec<(String, DependencyWait)> {
        kernel_dependency_waits(format!("{HEAD}{body}\0").as_bytes())
    }

    fn of(body: &str, kernel: &str) -> DependencyWait {
        match code_waits(format!("{HEAD}{body}").as_bytes()) {
            CodeWaits::NoneWait => NeverWaits,
            CodeWaits::Kernels(k) => k.get(kernel).copied().unwrap_or(Unknown),
        }
    }

    #[test]
    fn an_entry_that_waits_and_one_that_does_not() {
        let ptx = "
.visible .entry consumer(.param .u64 p)
.maxntid 256, 1, 1
{
	.reg .pred %p<2>;
	@%p1 griddepcontrol.wait;
	ret;
}
.visible .entry producer(.param .u64 p)
{
	griddepcontrol.launch_dependents;
	ret;
}";
        assert_eq!(
            waits(ptx),
            [("consumer".into(), Waits), ("producer".into(), NeverWaits)]
        );
    }

    #[test]
    fn a_wait_in_a_called_function_counts_transitively() {
        let ptx = "
.func (.param .b32 r) inner(.param .b32 x)
{
	griddepcontrol.wait;
	ret;
}
.func outer()
{
	{
	.reg .b32 t;
	call.uni (retval0), inner, (param0);
	}
	ret;
}
.visible .entry consumer()
{
	call.uni outer, ();
	ret;
}
.visible .entry loner()
{
	ret;
}";
        assert_eq!(of(ptx, "consumer"), Waits);
        assert_eq!(of(ptx, "loner"), NeverWaits);
    }

    #[test]
    fn a_waiting_function_that_is_not_called_does_not_count() {
        let ptx = "
.func unused()
{
	griddepcontrol.wait;
	ret;
}
.func used()
{
	ret;
}
.visible .entry k()
{
	call used;
	ret;
}";
        assert_eq!(of(ptx, "k"), NeverWaits);
    }

    #[test]
    fn nothing_waits_and_the_bodies_are_not_read() {
        let ptx = "
.visible .entry a(.param .u64 p) { ret; }
.visible .entry b() { ret; }";
        assert_eq!(
            code_waits(format!("{HEAD}{ptx}").as_bytes()),
            CodeWaits::NoneWait
        );
        assert_eq!(
            waits(ptx),
            [("a".into(), NeverWaits), ("b".into(), NeverWaits)]
        );
    }

    #[test]
    fn the_word_in_comments_and_strings_is_not_a_wait() {
        let ptx = "
// griddepcontrol.wait;
.global .b8 msg[24] = {0};
.visible .entry k()
{
	/* griddepcontrol.wait; call waiter; */
	// call.uni waiter, ();
	ret;
}
.func waiter() { griddepcontrol.wait; ret; }";
        assert_eq!(of(ptx, "k"), NeverWaits);
        // A string literal (in a pragma) holding the word.
        let ptx = "
.visible .entry k()
{
	.pragma \"griddepcontrol.wait; call x;\";
	ret;
}";
        assert_eq!(of(ptx, "k"), NeverWaits);
    }

    #[test]
    fn extern_undefined_and_pointer_calls_are_unknown() {
        let ptx = "
.extern .func (.param .b32 r) vprintf(.param .b64 f, .param .b64 a);
.visible .entry printer()
{
	call.uni (retval0), vprintf, (param0, param1);
	ret;
}
.visible .entry through_pointer()
{
	.reg .b64 %rd<2>;
	call (retval0), %rd1, (param0), prototype_0;
	ret;
}
.visible .entry waits_anyway()
{
	call.uni (retval0), vprintf, (param0, param1);
	griddepcontrol.wait;
	ret;
}";
        assert_eq!(of(ptx, "printer"), Unknown);
        assert_eq!(of(ptx, "through_pointer"), Unknown);
        assert_eq!(of(ptx, "waits_anyway"), Waits);
        assert_eq!(waits(ptx), [("waits_anyway".into(), Waits)]);
    }

    #[test]
    fn recursion_ends_and_unreadable_text_is_unknown() {
        let ptx = "
.func f() { call g; ret; }
.func g() { call f; ret; }
.visible .entry k() { call f; ret; }";
        assert_eq!(of(ptx, "k"), NeverWaits);
        assert_eq!(of(".visible .entry k() { call f; ", "k"), Unknown);
        assert!(waits(".visible .entry k() { griddepcontrol.wait; ").is_empty());
        assert!(kernel_dependency_waits(b"\x01\x02binary").is_empty());
    }

    #[test]
    fn pieces_agree_or_say_nothing() {
        let kernels = |list: &[(&str, DependencyWait)]| {
            CodeWaits::Kernels(list.iter().map(|&(n, w)| (n.to_owned(), w)).collect())
        };
        let sass = kernels(&[("a", Waits), ("b", NeverWaits), ("c", NeverWaits)]);
        let ptx = kernels(&[("a", NeverWaits), ("b", NeverWaits), ("c", Unknown)]);
        let agreed = CodeWaits::agreed([sass.clone(), ptx]);
        assert_eq!(
            (agreed.of("a"), agreed.of("b"), agreed.of("c")),
            (Unknown, NeverWaits, Unknown)
        );
        let with_none = CodeWaits::agreed([CodeWaits::NoneWait, sass]);
        assert_eq!(
            (with_none.of("a"), with_none.of("b")),
            (Unknown, NeverWaits)
        );
        assert_eq!(CodeWaits::agreed([]).of("a"), Unknown);
        assert_eq!(CodeWaits::agreed([CodeWaits::NoneWait]).of("z"), NeverWaits);
    }

    #[test]
    fn the_byte_form_round_trips() {
        for w in [Waits, NeverWaits, Unknown] {
            assert_eq!(DependencyWait::from_byte(w.to_byte()), Some(w));
        }
        assert_eq!(DependencyWait::from_byte(0), None);
    }
}
