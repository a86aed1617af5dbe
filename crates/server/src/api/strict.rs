//! Request bodies read as the OpenAPI document describes them. serde lets a JSON array stand
//! for a struct (its fields in order), so `"retry": [3]` would read as `{"max_attempts": 3}` and
//! `[]` as a struct of defaults; the document says object, and so does the server. [`Strict`] is
//! a deserializer over a parsed `serde_json::Value` that hands a struct, or a struct inside an
//! enum, only an object, and leaves every other value to `Value`'s own deserializer. Owns nothing
//! else: which fields exist and what they may hold is the types' business.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, Unexpected,
    VariantAccess, Visitor,
};
use serde::forward_to_deserialize_any;
use serde_json::{Error, Map, Value};

/// A deserializer over a borrowed JSON value that refuses arrays where structs are expected.
pub struct Strict<'a>(pub &'a Value);

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Unexpected::Unsigned(u),
            (_, Some(i), _) => Unexpected::Signed(i),
            (_, _, Some(f)) => Unexpected::Float(f),
            _ => Unexpected::Other("number"),
        },
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

impl<'de> Deserializer<'de> for Strict<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(items) => visit_array(items, visitor),
            Value::Object(object) => visit_object(object, visitor),
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(object) => visit_object(object, visitor),
            other => Err(de::Error::invalid_type(unexpected(other), &visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(variant) => visitor.visit_enum(BorrowedStrDeserializer::new(variant)),
            Value::Object(object) if object.len() == 1 => match object.iter().next() {
                Some((variant, value)) => visitor.visit_enum(Variant { variant, value }),
                None => Err(de::Error::invalid_length(0, &"an object with one key")),
            },
            other => Err(de::Error::invalid_type(
                unexpected(other),
                &"a string or an object with one key",
            )),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

fn visit_array<'de, V: Visitor<'de>>(items: &'de [Value], visitor: V) -> Result<V::Value, Error> {
    let mut seq = Seq(items.iter());
    let value = visitor.visit_seq(&mut seq)?;
    match seq.0.len() {
        0 => Ok(value),
        _ => Err(de::Error::invalid_length(items.len(), &"fewer elements")),
    }
}

fn visit_object<'de, V: Visitor<'de>>(
    object: &'de Map<String, Value>,
    visitor: V,
) -> Result<V::Value, Error> {
    visitor.visit_map(Entries {
        entries: object.iter(),
        value: None,
    })
}

struct Seq<'a>(std::slice::Iter<'a, Value>);

impl<'de> SeqAccess<'de> for Seq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|item| seed.deserialize(Strict(item)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries<'a> {
    entries: serde_json::map::Iter<'a>,
    value: Option<&'a Value>,
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.entries.next() {
            Some((key, value)) => {
                self.value = Some(value);
                seed.deserialize(BorrowedStrDeserializer::new(key))
                    .map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some(value) => seed.deserialize(Strict(value)),
            None => Err(de::Error::custom("a map value asked for before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// An externally tagged enum value: `{"variant": value}`.
struct Variant<'a> {
    variant: &'a str,
    value: &'a Value,
}

impl<'de> EnumAccess<'de> for Variant<'de> {
    type Error = Error;
    type Variant = Strict<'de>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Strict<'de>), Error> {
        let variant = seed.deserialize(BorrowedStrDeserializer::new(self.variant))?;
        Ok((variant, Strict(self.value)))
    }
}

impl<'de> VariantAccess<'de> for Strict<'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.0 {
            Value::Null => Ok(()),
            other => Err(de::Error::invalid_type(unexpected(other), &"null")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_struct("", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(deny_unknown_fields)]
    struct Retry {
        #[serde(default)]
        max_attempts: u32,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        every: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "snake_case")]
    enum Target {
        Shell(Retry),
        Named { name: String },
        Nothing,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Body {
        retry: Option<Retry>,
        targets: Vec<Target>,
    }

    fn read<T: de::DeserializeOwned>(json: &str) -> Result<T, String> {
        let value: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        T::deserialize(Strict(&value)).map_err(|e| e.to_string())
    }

    #[test]
    fn objects_read_as_structs_and_everything_else_as_usual() {
        let body: Body = read(
            r#"{"retry": {"max_attempts": 3, "labels": {"a": "b"}, "every": null},
                "targets": [{"shell": {}}, {"named": {"name": "x"}}, "nothing"]}"#,
        )
        .unwrap();
        assert_eq!(body.retry.as_ref().map(|r| r.max_attempts), Some(3));
        assert_eq!(body.retry.map(|r| r.labels.len()), Some(1));
        assert_eq!(
            body.targets,
            vec![
                Target::Shell(Retry::default()),
                Target::Named {
                    name: "x".to_string()
                },
                Target::Nothing
            ]
        );
        let none: Body = read(r#"{"retry": null, "targets": []}"#).unwrap();
        assert_eq!(none.retry, None);
    }

    #[test]
    fn arrays_never_stand_for_structs() {
        for json in [
            r#"[]"#,
            r#"[null, []]"#,
            r#"{"retry": [3], "targets": []}"#,
            r#"{"retry": [], "targets": []}"#,
            r#"{"targets": [{"shell": []}]}"#,
            r#"{"targets": [{"named": ["x"]}]}"#,
        ] {
            let error = read::<Body>(json).expect_err(json);
            assert!(error.contains("invalid type: sequence"), "{json}: {error}");
        }
    }

    #[test]
    fn wrong_types_and_unknown_fields_are_still_refused() {
        assert!(read::<Retry>(r#"{"max_attempts": 1.5}"#).is_err());
        assert!(read::<Retry>(r#"{"max_attempts": -1}"#).is_err());
        assert!(read::<Retry>(r#"{"labels": ["a"]}"#).is_err());
        assert!(read::<Retry>(r#"{"other": 1}"#).is_err());
        assert!(read::<Target>(r#"{"shell": {}, "named": {}}"#).is_err());
        assert!(read::<Target>(r#"{"unknown": {}}"#).is_err());
        assert!(read::<Target>(r#"7"#).is_err());
    }
}
