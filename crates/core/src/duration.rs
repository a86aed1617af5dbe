//! Durations as users write them: `"90s"`, `"5m"`, `"1h30m"`, `"250ms"`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A non-negative duration written the human way. Serialized back in the same style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub fn from_secs(secs: u64) -> Self {
        HumanDuration(Duration::from_secs(secs))
    }

    pub fn as_duration(self) -> Duration {
        self.0
    }

    /// As a chrono duration, for instant arithmetic (saturating for absurd values).
    pub fn as_chrono(self) -> chrono::Duration {
        chrono::Duration::from_std(self.0).unwrap_or(chrono::Duration::MAX)
    }
}

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.starts_with('-') {
            return Err(format!(
                "duration {s:?} is negative; durations are like 90s, 5m or 1h30m"
            ));
        }
        humantime::parse_duration(s)
            .map(HumanDuration)
            .map_err(|e| format!("{s:?} is not a duration like 90s, 5m or 1h30m ({e})"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = humantime::format_duration(self.0).to_string();
        // humantime writes "1m 30s"; sked writes it without spaces, as users type it.
        f.write_str(&text.replace(' ', ""))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_human_way() {
        for (text, secs) in [("90s", 90), ("5m", 300), ("1h30m", 5400), ("2h 5m", 7500)] {
            let d: HumanDuration = text.parse().unwrap();
            assert_eq!(d.0, Duration::from_secs(secs), "{text}");
            let again: HumanDuration = d.to_string().parse().unwrap();
            assert_eq!(again, d);
        }
        assert_eq!(
            HumanDuration(Duration::from_millis(250)).to_string(),
            "250ms"
        );
    }

    #[test]
    fn rejects_negative_and_garbage() {
        assert!("-5s"
            .parse::<HumanDuration>()
            .unwrap_err()
            .contains("negative"));
        assert!("soon".parse::<HumanDuration>().is_err());
        assert!("".parse::<HumanDuration>().is_err());
    }
}
