//! The XML of NVIDIA's topology files (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`): a small
//! reader into a tree of elements, each with its attributes in file order and the line it
//! starts on, and the writer of NVIDIA's layout (two spaces of indent per level, `<x/>` for an
//! element without children).
//!
//! The reader takes what those files hold and no more: elements, quoted attributes (`"` or
//! `'`, the five predefined entities), comments, an `<?xml ...?>` prolog and `<!...>`
//! declarations, which it skips. Text between elements other than white space, a missing
//! quote, a mismatched closing tag, a duplicate attribute, a second root, nesting deeper than
//! `MAX_DEPTH` are syntax errors naming the line. What the elements mean is `topo::file`'s.

/// Deepest nesting the reader accepts (NVIDIA's files nest about ten deep).
pub const MAX_DEPTH: usize = 64;

/// One element: its name, its attributes in file order, its child elements, and the line
/// (from 1) where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<Element>,
    pub line: usize,
}

impl Element {
    /// An element without attributes or children (line 0: made, not read).
    pub fn new(name: &str) -> Element {
        Element {
            name: name.to_string(),
            attrs: Vec::new(),
            children: Vec::new(),
            line: 0,
        }
    }

    /// This element with attribute `key` set to `value` (added after the others).
    pub fn with(mut self, key: &str, value: impl ToString) -> Element {
        self.attrs.push((key.to_string(), value.to_string()));
        self
    }

    /// The value of attribute `key`, if present.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a text is not well-formed, and on which line (from 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub msg: String,
}

/// The root element of `text`.
pub fn parse(text: &str) -> Result<Element, SyntaxError> {
    let mut r = Reader {
        text: text.as_bytes(),
        pos: 0,
        line: 1,
    };
    r.skip_misc()?;
    if r.at_end() {
        return Err(r.error("no element"));
    }
    let root = r.element(0)?;
    r.skip_misc()?;
    if !r.at_end() {
        return Err(r.error("content after the root element"));
    }
    Ok(root)
}

/// `root` in NVIDIA's layout, ending with a newline.
pub fn write(root: &Element) -> String {
    let mut out = String::new();
    write_element(&mut out, root, 0);
    out
}

fn write_element(out: &mut String, e: &Element, indent: usize) {
    out.push_str(&" ".repeat(indent));
    out.push('<');
    out.push_str(&e.name);
    for (k, v) in &e.attrs {
        out.push_str(&format!(" {k}=\"{}\"", escape(v)));
    }
    if e.children.is_empty() {
        out.push_str("/>\n");
        return;
    }
    out.push_str(">\n");
    for c in &e.children {
        write_element(out, c, indent + 2);
    }
    out.push_str(&" ".repeat(indent));
    out.push_str(&format!("</{}>\n", e.name));
}

/// `value` with the characters an attribute cannot hold as entities.
fn escape(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => s.push_str("&amp;"),
            '<' => s.push_str("&lt;"),
            '>' => s.push_str("&gt;"),
            '"' => s.push_str("&quot;"),
            c => s.push(c),
        }
    }
    s
}

/// `raw` with the five predefined entities replaced; an `&` that starts none stays as is.
fn unescape(raw: &str) -> String {
    const ENTITIES: [(&str, char); 5] = [
        ("&amp;", '&'),
        ("&lt;", '<'),
        ("&gt;", '>'),
        ("&quot;", '"'),
        ("&apos;", '\''),
    ];
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match ENTITIES.iter().find(|(e, _)| rest.starts_with(e)) {
            Some((e, c)) => {
                out.push(*c);
                rest = &rest[e.len()..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A cursor over the text, counting lines.
struct Reader<'a> {
    text: &'a [u8],
    pos: usize,
    line: usize,
}

impl Reader<'_> {
    fn error(&self, msg: impl Into<String>) -> SyntaxError {
        SyntaxError {
            line: self.line,
            msg: msg.into(),
        }
    }

    fn at_end(&self) -> bool {
        self.pos >= self.text.len()
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn starts_with(&self, s: &str) -> bool {
        self.text[self.pos..].starts_with(s.as_bytes())
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        if c == b'\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.bump();
        }
    }

    /// Past the next `end` (`what` names the construct for the error when there is none).
    fn skip_past(&mut self, end: &str, what: &str) -> Result<(), SyntaxError> {
        let start = self.line;
        while !self.at_end() {
            if self.starts_with(end) {
                for _ in 0..end.len() {
                    self.bump();
                }
                return Ok(());
            }
            self.bump();
        }
        Err(SyntaxError {
            line: start,
            msg: format!("unterminated {what}"),
        })
    }

    /// Past white space, comments, processing instructions and declarations.
    fn skip_misc(&mut self) -> Result<(), SyntaxError> {
        loop {
            self.skip_space();
            if self.starts_with("<!--") {
                self.skip_past("-->", "comment")?;
            } else if self.starts_with("<?") {
                self.skip_past("?>", "processing instruction")?;
            } else if self.starts_with("<!") {
                self.skip_past(">", "declaration")?;
            } else {
                return Ok(());
            }
        }
    }

    /// A name: up to white space, `=`, `/`, `>` or `<`.
    fn name(&mut self, what: &str) -> Result<String, SyntaxError> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| !c.is_ascii_whitespace() && !b"=/<>\"'".contains(&c))
        {
            self.bump();
        }
        if start == self.pos {
            return Err(match self.peek() {
                Some(c) => self.error(format!("expected {what}, found '{}'", c as char)),
                None => self.error(format!("expected {what}, found the end of the file")),
            });
        }
        Ok(String::from_utf8_lossy(&self.text[start..self.pos]).into_owned())
    }

    fn expect(&mut self, c: u8, context: &str) -> Result<(), SyntaxError> {
        match self.peek() {
            Some(found) if found == c => {
                self.bump();
                Ok(())
            }
            Some(found) => Err(self.error(format!(
                "expected '{}' {context}, found '{}'",
                c as char, found as char
            ))),
            None => Err(self.error(format!(
                "expected '{}' {context}, found the end of the file",
                c as char
            ))),
        }
    }

    /// A quoted attribute value.
    fn value(&mut self, key: &str) -> Result<String, SyntaxError> {
        let quote = match self.peek() {
            Some(q @ (b'"' | b'\'')) => q,
            _ => return Err(self.error(format!("the value of '{key}' is not quoted"))),
        };
        let start_line = self.line;
        self.bump();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c == quote {
                let raw = String::from_utf8_lossy(&self.text[start..self.pos]).into_owned();
                self.bump();
                return Ok(unescape(&raw));
            }
            if c == b'<' {
                return Err(self.error(format!("'<' in the value of '{key}'")));
            }
            self.bump();
        }
        Err(SyntaxError {
            line: start_line,
            msg: format!("unterminated value of '{key}'"),
        })
    }

    /// The element starting here (at its `<`), `depth` levels below the root.
    fn element(&mut self, depth: usize) -> Result<Element, SyntaxError> {
        if depth >= MAX_DEPTH {
            return Err(self.error(format!("elements nested deeper than {MAX_DEPTH}")));
        }
        let line = self.line;
        self.expect(b'<', "to open an element")?;
        let name = self.name("an element name")?;
        let mut e = Element {
            name,
            attrs: Vec::new(),
            children: Vec::new(),
            line,
        };
        loop {
            self.skip_space();
            match self.peek() {
                Some(b'/') => {
                    self.bump();
                    self.expect(b'>', &format!("after '/' in <{}>", e.name))?;
                    return Ok(e);
                }
                Some(b'>') => {
                    self.bump();
                    break;
                }
                None => return Err(self.error(format!("unterminated <{}>", e.name))),
                Some(_) => {
                    let key = self.name(&format!("an attribute or '>' in <{}>", e.name))?;
                    self.skip_space();
                    self.expect(b'=', &format!("after attribute '{key}'"))?;
                    self.skip_space();
                    let value = self.value(&key)?;
                    if e.attr(&key).is_some() {
                        return Err(self.error(format!("attribute '{key}' twice in <{}>", e.name)));
                    }
                    e.attrs.push((key, value));
                }
            }
        }
        loop {
            self.skip_misc()?;
            if self.at_end() {
                return Err(SyntaxError {
                    line,
                    msg: format!("<{}> is never closed", e.name),
                });
            }
            if self.starts_with("</") {
                self.bump();
                self.bump();
                let close = self.name("the name of a closing tag")?;
                if close != e.name {
                    return Err(self.error(format!("</{close}> closes <{}> (line {line})", e.name)));
                }
                self.skip_space();
                self.expect(b'>', &format!("to end </{close}>"))?;
                return Ok(e);
            }
            if self.peek() != Some(b'<') {
                return Err(self.error(format!("unexpected text in <{}>", e.name)));
            }
            e.children.push(self.element(depth + 1)?);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_elements_attributes_and_lines() {
        let text = "<?xml version=\"1.0\"?>\n<!-- a node -->\n<system version=\"1\">\n  \
                    <cpu numaid='0' affinity=\"ff\">\n    <pci busid=\"0000:17:00.0\"/>\n  \
                    </cpu>\n</system>\n";
        let root = parse(text).unwrap();
        assert_eq!(root.name, "system");
        assert_eq!(root.line, 3);
        assert_eq!(root.attr("version"), Some("1"));
        let cpu = &root.children[0];
        assert_eq!((cpu.attr("numaid"), cpu.line), (Some("0"), 4));
        assert_eq!(cpu.attrs[1], ("affinity".into(), "ff".into()));
        assert_eq!(cpu.children[0].attr("busid"), Some("0000:17:00.0"));
        assert!(cpu.children[0].children.is_empty());
    }

    #[test]
    fn writes_nvidias_layout_and_reads_it_back() {
        let mut cpu = Element::new("cpu").with("numaid", 0);
        cpu.children
            .push(Element::new("pci").with("busid", "0000:17:00.0"));
        let mut root = Element::new("system")
            .with("version", 1)
            .with("name", "a<b&\"c\"");
        root.children.push(cpu);
        let text = write(&root);
        assert_eq!(
            text,
            "<system version=\"1\" name=\"a&lt;b&amp;&quot;c&quot;\">\n  <cpu numaid=\"0\">\n    \
             <pci busid=\"0000:17:00.0\"/>\n  </cpu>\n</system>\n"
        );
        let back = parse(&text).unwrap();
        assert_eq!(back.attr("name"), Some("a<b&\"c\""));
        assert_eq!(back.children[0].children[0].line, 3);
    }

    #[test]
    fn entities_unknown_to_xml_stay_as_written() {
        assert_eq!(unescape("a&amp;b&apos;&x;&"), "a&b'&x;&");
    }

    fn error_of(text: &str) -> SyntaxError {
        parse(text).unwrap_err()
    }

    #[test]
    fn malformed_text_is_an_error_naming_the_line() {
        let e = error_of("<system version=\"1\">\n  <cpu numaid=0/>\n</system>");
        assert_eq!(e.line, 2);
        assert!(e.msg.contains("not quoted"), "{}", e.msg);
        let e = error_of("<system>\n  <cpu>\n  </pci>\n</system>");
        assert_eq!(e.line, 3);
        assert!(e.msg.contains("</pci> closes <cpu> (line 2)"), "{}", e.msg);
        let e = error_of("<system>\n<cpu>\n");
        assert_eq!(e.line, 2);
        assert!(e.msg.contains("<cpu> is never closed"), "{}", e.msg);
        let e = error_of("<system a=\"1\" a=\"2\"/>");
        assert!(e.msg.contains("'a' twice"), "{}", e.msg);
        let e = error_of("<system>\n hello\n</system>");
        assert_eq!((e.line, e.msg.as_str()), (2, "unexpected text in <system>"));
        let e = error_of("<system/>\n<system/>");
        assert!(e.msg.contains("after the root"), "{}", e.msg);
        let e = error_of("<system a=\"1>\n");
        assert!(e.msg.contains("unterminated value of 'a'"), "{}", e.msg);
        let e = error_of("<!-- open\n");
        assert!(e.msg.contains("unterminated comment"), "{}", e.msg);
        assert!(error_of("").msg.contains("no element"));
        assert!(error_of("<system").msg.contains("unterminated <system>"));
        assert!(error_of("<>").msg.contains("element name"));
        assert!(error_of("<a b>").msg.contains("after attribute 'b'"));
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = "<a>".repeat(MAX_DEPTH + 1) + &"</a>".repeat(MAX_DEPTH + 1);
        assert!(error_of(&deep).msg.contains("nested deeper"));
        let ok = "<a>".repeat(MAX_DEPTH) + &"</a>".repeat(MAX_DEPTH);
        assert!(parse(&ok).is_ok());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // Every prefix of a valid file, and bytes that are no UTF-8.
        let text = "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:17:00.0\">\
                    <gpu dev=\"0\"><nvlink target=\"x\" count=\"2\"/></gpu></pci></cpu></system>";
        for end in 0..text.len() {
            let _ = parse(&text[..end]);
        }
        let junk = String::from_utf8_lossy(&[0x3c, 0xff, 0xfe, 0x3e, 0x3c, 0x2f]).into_owned();
        assert!(parse(&junk).is_err());
    }
}
