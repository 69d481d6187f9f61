//! Objects nested in a request (`limits`, `network`, a case of `tests`, ...)
//! are JSON objects only. serde fills a struct from an array of its fields
//! in order as readily as from an object, which no client means to send: a
//! field holding one names itself in `#[serde(deserialize_with = ...)]`
//! with [`optional`] or [`list`], and an array there is refused, naming the
//! field ([`base64`] does the same for a file's `{"base64": ...}`). A whole
//! body that is an array is refused by the HTTP front end; MCP tool
//! arguments are an object by the protocol.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A struct a request holds in a field of its own.
pub(crate) trait RequestObject {
    /// The field that holds it, as the refusal names it.
    const FIELD: &'static str;
}

/// An `Option<T>` field: absent or null is `None`, an array is refused.
pub(crate) fn optional<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + RequestObject,
{
    Ok(Option::<Object<T, false>>::deserialize(deserializer)?.map(|o| o.0))
}

/// A `Vec<T>` field: each item is an object, an array item is refused.
pub(crate) fn list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + RequestObject,
{
    let items = Vec::<Object<T, true>>::deserialize(deserializer)?;
    Ok(items.into_iter().map(|o| o.0).collect())
}

/// The fields of `FileContent::Base64` (an untagged variant, whose derived
/// code would also read them from an array), from `{"base64": "..."}` only.
pub(crate) fn base64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    /// A binary file's content.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Base64 {
        base64: String,
    }
    impl RequestObject for Base64 {
        const FIELD: &'static str = "files";
    }
    let content = Object::<Base64, false>::deserialize(deserializer)?.0;
    Ok(content.base64)
}

/// `T` read from a JSON object only; `ITEM`: one item of its field's list.
struct Object<T, const ITEM: bool>(T);

impl<'de, T, const ITEM: bool> Deserialize<'de> for Object<T, ITEM>
where
    T: Deserialize<'de> + RequestObject,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let field = Field {
            name: T::FIELD,
            item: ITEM,
        };
        T::deserialize(ObjectOnly {
            inner: deserializer,
            field,
        })
        .map(Object)
    }
}

/// Where the object is, for the refusal.
#[derive(Clone, Copy)]
struct Field {
    name: &'static str,
    /// One item of the field's list.
    item: bool,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        if self.item {
            write!(f, "every item of {}", self.name)
        } else {
            f.write_str(self.name)
        }
    }
}

/// A deserializer that hands a struct's visitor a map and refuses a
/// sequence; `T`'s derived `Deserialize` asks it for nothing but a struct.
struct ObjectOnly<D> {
    inner: D,
    field: Field,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectOnly<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(MapOnly {
            visitor,
            field: self.field,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// A struct's visitor that takes a map only; anything else but a sequence
/// is refused as the struct's own visitor refuses it.
struct MapOnly<V> {
    visitor: V,
    field: Field,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for MapOnly<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.visitor.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<V::Value, A::Error> {
        Err(de::Error::custom(format_args!(
            "{} must be a JSON object ({{...}}), not an array",
            self.field
        )))
    }
}
