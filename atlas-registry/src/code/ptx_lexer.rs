//! PTX cut into tokens, for the readers of PTX text: the parameter layouts of its kernels
//! ([`layout`](crate::code::layout)) and whether they wait for the grid they depend on
//! ([`dependency_wait`](crate::code::dependency_wait)). Whitespace and comments are dropped and
//! lines counted; what a reader needs is told apart (directives, words, numbers, strings, any
//! other character), nothing more.

/// What the lexer cannot read past: a comment, string or block never closed, and the line where
/// it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LexError {
    /// A `/*` comment without its `*/`.
    UnterminatedComment {
        /// Where it opens.
        line: usize,
    },
    /// A string literal without its closing quote.
    UnterminatedString {
        /// Where it opens.
        line: usize,
    },
    /// A `{` without its `}`.
    UnclosedBrace {
        /// Where it opens.
        line: usize,
    },
}

/// One PTX token; only what the `.entry` grammar needs is told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Token<'t> {
    /// `.entry`, `.param`, `.u64`, ...
    Directive(&'t str),
    /// An identifier (`scale`, `_Z5scalePfj`, `%r1`, `$L__BB0_2`).
    Word(&'t str),
    /// A number as written (`24`, `0x18`, `0f3F800000`).
    Number(&'t str),
    /// A string literal; its contents never matter here.
    Text,
    /// Any other character.
    Punct(char),
    /// The end of the text.
    End,
}

impl Token<'_> {
    /// How an error message shows the token.
    pub(crate) fn shown(self) -> String {
        match self {
            Self::Directive(s) | Self::Word(s) | Self::Number(s) => {
                format!("`{}`", s.escape_debug())
            }
            Self::Text => "a string literal".to_owned(),
            Self::Punct(c) => format!("`{}`", c.escape_debug()),
            Self::End => "the end of the text".to_owned(),
        }
    }
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$'
}

/// Splits PTX into tokens, dropping whitespace and comments and counting lines.
pub(crate) struct Lexer<'t> {
    text: &'t str,
    at: usize,
    line: usize,
    peeked: Option<(Token<'t>, usize)>,
}

impl<'t> Lexer<'t> {
    pub(crate) fn new(text: &'t str) -> Self {
        Self {
            text,
            at: 0,
            line: 1,
            peeked: None,
        }
    }

    /// The next token and its line.
    pub(crate) fn next(&mut self) -> Result<(Token<'t>, usize), LexError> {
        match self.peeked.take() {
            Some(token) => Ok(token),
            None => self.scan(),
        }
    }

    /// The next token, left in place.
    pub(crate) fn peek(&mut self) -> Result<Token<'t>, LexError> {
        let token = self.next()?;
        self.peeked = Some(token);
        Ok(token.0)
    }

    /// `self.text[start..end]`; every position the lexer stops at is a character boundary.
    fn slice(&self, start: usize, end: usize) -> &'t str {
        self.text.get(start..end).unwrap_or_default()
    }

    fn scan(&mut self) -> Result<(Token<'t>, usize), LexError> {
        let bytes = self.text.as_bytes();
        let first = loop {
            match (bytes.get(self.at), bytes.get(self.at + 1)) {
                (None, _) => return Ok((Token::End, self.line)),
                (Some(b'\n'), _) => {
                    self.line += 1;
                    self.at += 1;
                }
                (Some(b), _) if b.is_ascii_whitespace() => self.at += 1,
                (Some(b'/'), Some(b'/')) => {
                    self.at = bytes[self.at..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .map_or(bytes.len(), |n| self.at + n);
                }
                (Some(b'/'), Some(b'*')) => {
                    let body = self.at + 2;
                    let Some(len) = bytes
                        .get(body..)
                        .and_then(|rest| rest.windows(2).position(|w| w == b"*/"))
                    else {
                        return Err(LexError::UnterminatedComment { line: self.line });
                    };
                    self.line += bytes[body..body + len]
                        .iter()
                        .filter(|&&b| b == b'\n')
                        .count();
                    self.at = body + len + 2;
                }
                (Some(&b), _) => break b,
            }
        };
        let (start, line) = (self.at, self.line);
        let run_end = |from: usize| {
            bytes
                .get(from..)
                .and_then(|rest| rest.iter().position(|&b| !is_word_byte(b)))
                .map_or(bytes.len(), |n| from + n)
        };
        let token = if first == b'"' {
            let mut i = start + 1;
            loop {
                match bytes.get(i) {
                    None => return Err(LexError::UnterminatedString { line }),
                    Some(b'\\') => {
                        if bytes.get(i + 1) == Some(&b'\n') {
                            self.line += 1;
                        }
                        i += 2;
                    }
                    Some(b'"') => break,
                    Some(b'\n') => {
                        self.line += 1;
                        i += 1;
                    }
                    Some(_) => i += 1,
                }
            }
            self.at = i + 1;
            Token::Text
        } else if first == b'.' && bytes.get(start + 1).is_some_and(|&b| is_word_byte(b)) {
            self.at = run_end(start + 1);
            Token::Directive(self.slice(start, self.at))
        } else if first.is_ascii_alphabetic() || matches!(first, b'_' | b'$' | b'%') {
            self.at = run_end(start + 1);
            Token::Word(self.slice(start, self.at))
        } else if first.is_ascii_digit() {
            self.at = run_end(start + 1);
            Token::Number(self.slice(start, self.at))
        } else {
            let c = self
                .slice(start, self.text.len())
                .chars()
                .next()
                .unwrap_or('\u{fffd}');
            self.at = start + c.len_utf8().max(1);
            Token::Punct(c)
        };
        Ok((token, line))
    }

    /// Skips to the `}` that closes a `{` (already read) on line `opened`.
    ///
    /// A body declares nothing a layout needs, and every load reads its blob's layouts: so the
    /// bytes are scanned for newlines and braces, and only comments and strings (which may hold
    /// braces) are lexed, several times faster than cutting the whole body into tokens.
    pub(crate) fn skip_block(&mut self, opened: usize) -> Result<(), LexError> {
        let bytes = self.text.as_bytes();
        let mut depth = 1usize;
        let mut token = self.peeked.take().map(|(token, _)| token);
        loop {
            let token = match token.take() {
                Some(token) => token,
                None => {
                    let rest = bytes.get(self.at..).unwrap_or_default();
                    let plain = plain_run(rest);
                    self.line += rest[..plain].iter().filter(|&&b| b == b'\n').count();
                    self.at += plain;
                    match rest.get(plain) {
                        None => Token::End,
                        // A comment, or a string: `scan` lexes it and the token after a comment.
                        Some(b'/' | b'"') => self.scan()?.0,
                        Some(&brace) => {
                            self.at += 1;
                            Token::Punct(char::from(brace))
                        }
                    }
                }
            };
            match token {
                Token::Punct('{') => depth += 1,
                Token::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                Token::End => return Err(LexError::UnclosedBrace { line: opened }),
                _ => {}
            }
        }
    }
}

/// How many bytes of `bytes` come before the first `{`, `}`, `/` or `"`: eight at a time, with the
/// zero-byte test on each 64-bit word (a byte loop with four comparisons costs several times
/// more, and every load reads its PTX's layouts).
fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Whether a byte of `word` is `b`: exact, no false positives.
    let holds = |word: u64, b: u8| {
        let x = word ^ (ONES * u64::from(b));
        x.wrapping_sub(ONES) & !x & HIGHS != 0
    };
    let mut at = 0;
    while let Some(word) = bytes
        .get(at..at + 8)
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
    {
        let word = u64::from_le_bytes(word);
        if holds(word, b'{') || holds(word, b'}') || holds(word, b'/') || holds(word, b'"') {
            break;
        }
        at += 8;
    }
    let tail = &bytes[at..];
    at + (tail.iter())
        .position(|&b| matches!(b, b'{' | b'}' | b'/' | b'"'))
        .unwrap_or(tail.len())
}
