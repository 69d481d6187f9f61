//! Values in Python's `marshal` format, written from anything `Serialize`:
//! what the worker reads a clean run's `exec` frame in (see `protocol`). The
//! format's C reader is part of every interpreter and always loaded, and it
//! reads such a frame in a few microseconds, where the worker's pure-Python
//! msgpack decoder takes twenty or more.
//!
//! Only the types that have been in the format since Python 2, read the
//! same by every Python 3: `None`, booleans, `int` (32-bit `i`, or `l` in
//! base-2¹⁵ digits), `float` (binary, `g`), `str` (UTF-8, `u`), `bytes`
//! (`s`), `tuple`, `list` and `dict` (entries ended by `0`). No references,
//! no code objects. A struct or map becomes a `dict`, a sequence a `list`,
//! a tuple a `tuple`, an enum's unit variant its name, and a newtype variant
//! a one-entry `dict`.

use serde::ser::{self, Serialize};

/// A value marshal cannot carry, or one too long for its 32-bit lengths.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// What a `Serialize` implementation reported.
    #[error("{0}")]
    Custom(String),
    /// A shape the format has no type for here (tuple and struct variants).
    #[error("{0} cannot be written as marshal")]
    Unsupported(&'static str),
    /// A string, byte string or sequence over `i32::MAX` long.
    #[error("{0} items or bytes are over marshal's limit of {max}", max = i32::MAX)]
    TooLong(usize),
}

impl ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error::Custom(msg.to_string())
    }
}

/// Append `value`, marshalled, to `out`.
pub(crate) fn to_writer<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), Error> {
    value.serialize(&mut Writer { out })
}

struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    fn length(&mut self, n: usize) -> Result<(), Error> {
        let n = i32::try_from(n).map_err(|_| Error::TooLong(n))?;
        self.out.extend_from_slice(&n.to_le_bytes());
        Ok(())
    }

    /// An integer: `i` when it fits 32 bits, else `l`: the digit count
    /// (negative for a negative number), then the magnitude's base-2¹⁵
    /// digits, least significant first, the last one not zero.
    fn int(&mut self, negative: bool, magnitude: u128) {
        if magnitude <= i32::MAX as u128 || (negative && magnitude == 1 << 31) {
            let value = if negative {
                (magnitude as i64).wrapping_neg() as i32
            } else {
                magnitude as i32
            };
            self.out.push(b'i');
            self.out.extend_from_slice(&value.to_le_bytes());
            return;
        }
        let mut digits = Vec::with_capacity(9);
        let mut rest = magnitude;
        while rest > 0 {
            digits.push((rest & 0x7fff) as u16);
            rest >>= 15;
        }
        let count = digits.len() as i32;
        self.out.push(b'l');
        self.out
            .extend_from_slice(&(if negative { -count } else { count }).to_le_bytes());
        for digit in digits {
            self.out.extend_from_slice(&digit.to_le_bytes());
        }
    }

    fn signed(&mut self, v: i128) {
        self.int(v < 0, v.unsigned_abs());
    }

    fn unsigned(&mut self, v: u128) {
        self.int(false, v);
    }

    fn text(&mut self, v: &str) -> Result<(), Error> {
        self.out.push(b'u');
        self.length(v.len())?;
        self.out.extend_from_slice(v.as_bytes());
        Ok(())
    }

    /// A container whose count follows its type code, written now when
    /// known, else patched in when it ends.
    fn counted(&mut self, code: u8, len: Option<usize>) -> Result<Compound<'_, 'a>, Error> {
        self.out.push(code);
        let at = self.out.len();
        self.length(len.unwrap_or(0))?;
        Ok(Compound {
            writer: self,
            count: len.is_none().then_some((at, 0)),
        })
    }

    fn dict(&mut self) -> Compound<'_, 'a> {
        self.out.push(b'{');
        Compound {
            writer: self,
            count: None,
        }
    }
}

/// A container being written. `count`: where its count goes and how many
/// items it has had, when that was not known at its start.
struct Compound<'w, 'a> {
    writer: &'w mut Writer<'a>,
    count: Option<(usize, usize)>,
}

impl Compound<'_, '_> {
    fn item<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if let Some((_, n)) = &mut self.count {
            *n += 1;
        }
        value.serialize(&mut *self.writer)
    }

    fn end_counted(self) -> Result<(), Error> {
        if let Some((at, n)) = self.count {
            let n = i32::try_from(n).map_err(|_| Error::TooLong(n))?;
            self.writer.out[at..at + 4].copy_from_slice(&n.to_le_bytes());
        }
        Ok(())
    }

    fn end_dict(self) -> Result<(), Error> {
        self.writer.out.push(b'0');
        Ok(())
    }
}

/// The serializer's integer methods: each widens its value for `signed`
/// or `unsigned`, which write every width alike.
macro_rules! ints {
    ($($method:ident: $ty:ty => $write:ident,)*) => {$(
        fn $method(self, v: $ty) -> Result<(), Error> {
            self.$write(v.into());
            Ok(())
        }
    )*};
}

impl<'w, 'a> ser::Serializer for &'w mut Writer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'w, 'a>;
    type SerializeTuple = Compound<'w, 'a>;
    type SerializeTupleStruct = Compound<'w, 'a>;
    type SerializeTupleVariant = ser::Impossible<(), Error>;
    type SerializeMap = Compound<'w, 'a>;
    type SerializeStruct = Compound<'w, 'a>;
    type SerializeStructVariant = ser::Impossible<(), Error>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push(if v { b'T' } else { b'F' });
        Ok(())
    }
    ints! {
        serialize_i8: i8 => signed,
        serialize_i16: i16 => signed,
        serialize_i32: i32 => signed,
        serialize_i64: i64 => signed,
        serialize_i128: i128 => signed,
        serialize_u8: u8 => unsigned,
        serialize_u16: u16 => unsigned,
        serialize_u32: u32 => unsigned,
        serialize_u64: u64 => unsigned,
        serialize_u128: u128 => unsigned,
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.out.push(b'g');
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.text(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        self.out.push(b's');
        self.length(v.len())?;
        self.out.extend_from_slice(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.out.push(b'N');
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_none()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.text(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.out.push(b'{');
        self.text(variant)?;
        value.serialize(&mut *self)?;
        self.out.push(b'0');
        Ok(())
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        self.counted(b'[', len)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, Error> {
        self.counted(b'(', Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        self.counted(b'(', Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(Error::Unsupported("a tuple variant"))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Ok(self.dict())
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        Ok(self.dict())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(Error::Unsupported("a struct variant"))
    }
}

/// The counted containers (list, tuple, tuple struct) take their items alike.
macro_rules! counted {
    ($trait:ident, $add:ident) => {
        impl ser::$trait for Compound<'_, '_> {
            type Ok = ();
            type Error = Error;
            fn $add<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.item(value)
            }
            fn end(self) -> Result<(), Error> {
                self.end_counted()
            }
        }
    };
}

counted!(SerializeSeq, serialize_element);
counted!(SerializeTuple, serialize_element);
counted!(SerializeTupleStruct, serialize_field);

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        key.serialize(&mut *self.writer)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(&mut *self.writer)
    }
    fn end(self) -> Result<(), Error> {
        self.end_dict()
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.writer.text(key)?;
        value.serialize(&mut *self.writer)
    }
    fn end(self) -> Result<(), Error> {
        self.end_dict()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marshal<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        to_writer(&mut out, value).unwrap();
        out
    }

    #[test]
    fn an_int_is_32_bits_where_it_fits_and_base_2_15_digits_beyond() {
        assert_eq!(marshal(&5u8), b"i\x05\x00\x00\x00");
        assert_eq!(marshal(&-1i64), b"i\xff\xff\xff\xff");
        assert_eq!(marshal(&i32::MIN), b"i\x00\x00\x00\x80");
        assert_eq!(marshal(&i32::MAX), b"i\xff\xff\xff\x7f");
        // 2**31 = 2 * (2**15)**2: digits 0, 0, 2.
        assert_eq!(
            marshal(&(1u64 << 31)),
            b"l\x03\x00\x00\x00\x00\x00\x00\x00\x02\x00"
        );
        assert_eq!(
            marshal(&(-(1i64 << 31) - 1)),
            b"l\xfd\xff\xff\xff\x01\x00\x00\x00\x02\x00"
        );
        // u64::MAX: five 15-bit digits of 0x7fff, then 0xf (64 = 4 * 15 + 4).
        let mut max = b"l\x05\x00\x00\x00".to_vec();
        for digit in [0x7fffu16, 0x7fff, 0x7fff, 0x7fff, 0xf] {
            max.extend_from_slice(&digit.to_le_bytes());
        }
        assert_eq!(marshal(&u64::MAX), max);
    }

    #[test]
    fn sequences_of_unknown_length_get_their_count_when_they_end() {
        struct Unsized;
        impl Serialize for Unsized {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeSeq;
                let mut seq = s.serialize_seq(None)?;
                for i in 1..=3u8 {
                    seq.serialize_element(&i)?;
                }
                seq.end()
            }
        }
        let want = b"[\x03\x00\x00\x00i\x01\x00\x00\x00i\x02\x00\x00\x00i\x03\x00\x00\x00";
        assert_eq!(marshal(&Unsized), want);
        assert_eq!(marshal(&[1u8, 2, 3][..]), want);
    }

    #[test]
    fn a_struct_is_a_dict_ended_by_null() {
        #[derive(serde::Serialize)]
        struct S<'a> {
            a: Option<&'a str>,
            #[serde(with = "serde_bytes")]
            b: &'a [u8],
            c: (bool, f64),
        }
        let bytes = marshal(&S {
            a: Some("é"),
            b: b"\x00",
            c: (true, 0.5),
        });
        let mut want = b"{u\x01\x00\x00\x00au\x02\x00\x00\x00\xc3\xa9".to_vec();
        want.extend_from_slice(b"u\x01\x00\x00\x00bs\x01\x00\x00\x00\x00");
        want.extend_from_slice(b"u\x01\x00\x00\x00c(\x02\x00\x00\x00Tg");
        want.extend_from_slice(&0.5f64.to_le_bytes());
        want.push(b'0');
        assert_eq!(bytes, want);
    }

    #[test]
    fn struct_variants_are_refused() {
        #[derive(serde::Serialize)]
        enum E {
            V { x: u8 },
        }
        let err = to_writer(&mut Vec::new(), &E::V { x: 1 }).unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
    }
}
