//! One registered setting ([`Param`]): its name, type, default and description, and the typed
//! reads the library makes through it. The values come from [`super::lookup`] (environment,
//! then configuration files); the reads keep the library's parsing of each type: integers are
//! decimal or `0x` hexadecimal, a boolean is an integer (non-zero is true), a malformed value
//! falls back to the default with a warning.

use super::{lookup, parse_int, Source};

/// What a setting holds, and so how it is parsed, read through the C API and dumped.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// An integer where 0 is false and any other value true.
    Bool,
    /// A signed 64-bit integer.
    Int,
    /// Free text.
    Text,
    /// One name of `choices` (case-insensitive); read as the `i32` value of the choice.
    OneOf {
        ctype: &'static str,
        choices: &'static [Choice],
    },
    /// A comma-separated list of names of `choices`, `^` first to invert it; read as the
    /// `u64` mask of the listed choices' bits.
    ListOf(&'static [Choice]),
}

/// One accepted name of a [`Kind::OneOf`] or [`Kind::ListOf`] setting.
#[derive(Clone, Copy, Debug)]
pub struct Choice {
    pub name: &'static str,
    pub value: u64,
    pub description: &'static str,
}

/// A setting's value when it is not set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Default {
    Bool(bool),
    Int(i64),
    Text(&'static str),
    /// No value (a text setting left out, an enum the library treats as off).
    Unset,
}

/// One `NCCL_*` or `OXCCL_*` setting, declared once in [`super::registry`].
#[derive(Debug)]
pub struct Param {
    pub name: &'static str,
    pub kind: Kind,
    pub default: Default,
    /// One line, as NVIDIA's documentation describes the setting (ours for `OXCCL_*`).
    pub description: &'static str,
    /// Whether NVIDIA's documentation lists it (the dump shows only these by default).
    pub documented: bool,
    /// A boolean that also takes NVIDIA's words `T`/`TRUE`/`F`/`FALSE` (any case).
    pub words: bool,
}

/// A setting's current value, typed as the C API reads it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Text(Option<String>),
    /// The `i32` value of a [`Kind::OneOf`] choice (0 when unset or not a choice).
    Choice(i32),
    /// The `u64` mask of a [`Kind::ListOf`] setting.
    Mask(u64),
}

impl Param {
    const fn new(
        name: &'static str,
        kind: Kind,
        default: Default,
        description: &'static str,
    ) -> Param {
        Param {
            name,
            kind,
            default,
            description,
            documented: true,
            words: false,
        }
    }

    /// A boolean setting.
    pub const fn boolean(name: &'static str, default: bool, description: &'static str) -> Param {
        Param::new(name, Kind::Bool, Default::Bool(default), description)
    }

    /// An integer setting.
    pub const fn integer(name: &'static str, default: i64, description: &'static str) -> Param {
        Param::new(name, Kind::Int, Default::Int(default), description)
    }

    /// A text setting, unset by default when `default` is `None`.
    pub const fn text(
        name: &'static str,
        default: Option<&'static str>,
        description: &'static str,
    ) -> Param {
        let default = match default {
            Some(t) => Default::Text(t),
            None => Default::Unset,
        };
        Param::new(name, Kind::Text, default, description)
    }

    /// A setting naming one of `choices` (C type `ctype`), unset by default.
    pub const fn one_of(
        name: &'static str,
        ctype: &'static str,
        choices: &'static [Choice],
        description: &'static str,
    ) -> Param {
        Param::new(
            name,
            Kind::OneOf { ctype, choices },
            Default::Unset,
            description,
        )
    }

    /// A comma-separated list of `choices`, `default` when unset.
    pub const fn list_of(
        name: &'static str,
        choices: &'static [Choice],
        default: &'static str,
        description: &'static str,
    ) -> Param {
        Param::new(
            name,
            Kind::ListOf(choices),
            Default::Text(default),
            description,
        )
    }

    /// The same setting, not in NVIDIA's documentation.
    pub const fn undocumented(mut self) -> Param {
        self.documented = false;
        self
    }

    /// The same boolean setting, also taking the words `T`/`TRUE`/`F`/`FALSE`.
    pub const fn with_words(mut self) -> Param {
        self.words = true;
        self
    }

    /// The value as set (environment, then configuration files) and where, or `None`.
    pub fn lookup(&'static self) -> Option<(String, Source)> {
        debug_assert!(
            super::registry::is_registered(self),
            "{} is read but not in the registry",
            self.name
        );
        lookup(self.name)
    }

    /// The value as set, without the default.
    pub fn raw(&'static self) -> Option<String> {
        self.lookup().map(|(v, _)| v)
    }

    /// Where the current value comes from.
    pub fn source(&'static self) -> Source {
        self.lookup().map_or(Source::Default, |(_, s)| s)
    }

    /// The value as set, else the text default.
    pub fn get(&'static self) -> Option<String> {
        self.raw().or_else(|| match self.default {
            Default::Text(t) => Some(t.to_string()),
            _ => None,
        })
    }

    /// [`Param::get`], empty when neither set nor defaulted.
    pub fn string(&'static self) -> String {
        self.get().unwrap_or_default()
    }

    /// An integer setting with its registered default.
    pub fn int(&'static self) -> i64 {
        self.int_or(self.default_int())
    }

    /// An integer setting whose default depends on the caller (another setting, a config).
    /// A malformed value falls back to `default` with a warning; a set value is logged under
    /// `ENV`.
    pub fn int_or(&'static self, default: i64) -> i64 {
        let name = self.name;
        match self.raw() {
            None => default,
            Some(v) => match parse_int(&v) {
                Some(n) => {
                    crate::info!(ENV, "{name} set by environment to {n}");
                    n
                }
                None => {
                    crate::warn!("Invalid value {v:?} for {name}, using default {default}");
                    default
                }
            },
        }
    }

    /// A boolean setting with its registered default.
    pub fn flag(&'static self) -> bool {
        if self.words {
            if let Some(b) = self.raw().as_deref().and_then(bool_word) {
                return b;
            }
        }
        self.int_or(self.default_int()) != 0
    }

    /// The registered default as an integer (a boolean as 0/1).
    fn default_int(&self) -> i64 {
        match self.default {
            Default::Int(n) => n,
            Default::Bool(b) => b as i64,
            _ => 0,
        }
    }

    /// The current value, typed by [`Kind`].
    pub fn value(&'static self) -> Value {
        match self.kind {
            Kind::Bool => Value::Bool(self.flag()),
            Kind::Int => Value::Int(self.int()),
            Kind::Text => Value::Text(self.get()),
            Kind::OneOf { choices, .. } => Value::Choice(
                self.get()
                    .and_then(|v| choice_named(choices, &v))
                    .map_or(0, |c| c.value as i32),
            ),
            Kind::ListOf(choices) => Value::Mask(mask_of(choices, &self.string())),
        }
    }

    /// The current value as text: `TRUE`/`FALSE`, a number, the text or list as set, the
    /// choice's name; `<unset>` for an unset setting without a default, `<unknown>` for a
    /// value that is not one of the choices.
    pub fn text_value(&'static self) -> String {
        match (self.kind, self.value()) {
            (Kind::OneOf { choices, .. }, _) => match self.get() {
                None => UNSET.to_string(),
                Some(v) => choice_named(choices, &v).map_or(UNKNOWN.to_string(), |c| c.name.into()),
            },
            (_, Value::Bool(b)) => bool_text(b).to_string(),
            (_, Value::Int(n)) => n.to_string(),
            _ => self.get().unwrap_or_else(|| UNSET.to_string()),
        }
    }

    /// The default as text, in the form of [`Param::text_value`].
    pub fn default_text(&self) -> String {
        match self.default {
            Default::Bool(b) => bool_text(b).to_string(),
            Default::Int(n) => n.to_string(),
            Default::Text(t) => t.to_string(),
            Default::Unset => UNSET.to_string(),
        }
    }
}

/// Text of a setting that is neither set nor defaulted.
pub const UNSET: &str = "<unset>";
/// Text of a one-of setting whose value is none of its choices.
pub const UNKNOWN: &str = "<unknown>";

fn bool_text(b: bool) -> &'static str {
    if b {
        "TRUE"
    } else {
        "FALSE"
    }
}

/// NVIDIA's boolean words, any case: `T`/`TRUE` and `F`/`FALSE`.
fn bool_word(v: &str) -> Option<bool> {
    match v.trim().to_ascii_uppercase().as_str() {
        "T" | "TRUE" => Some(true),
        "F" | "FALSE" => Some(false),
        _ => None,
    }
}

/// The choice named `name` (case-insensitive).
pub fn choice_named<'a>(choices: &'a [Choice], name: &str) -> Option<&'a Choice> {
    choices
        .iter()
        .find(|c| c.name.eq_ignore_ascii_case(name.trim()))
}

/// The mask of a comma-separated list of choice names; `^` first inverts it; names that are
/// not choices are ignored.
pub fn mask_of(choices: &[Choice], list: &str) -> u64 {
    let (invert, list) = match list.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let mask = list
        .split(',')
        .filter_map(|name| choice_named(choices, name))
        .fold(0u64, |m, c| m | c.value);
    if invert {
        !mask
    } else {
        mask
    }
}
