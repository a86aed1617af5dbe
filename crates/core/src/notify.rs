//! Alerts: what a `notify` rule says (a job's, or its namespace's default), which events the end
//! of a run or a late start raises, the message each channel carries, and when a send that
//! failed is tried again.
//!
//! Everything here is pure. The store records a notification in the same transaction that ends
//! the run (so an event is never lost, and recording it twice is refused by its key); the
//! server's notifier sends what is recorded. Sending is at least once: a node that dies between
//! sending and recording it sent hands the notification to another after its claim lapses, and
//! the receiver tells the two apart by the notification's id.

use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::run::{RunState, SkipReason};
use crate::target::{check_headers, check_url, TargetValue};
use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Rules in one `notify` list.
pub const MAX_RULES: usize = 8;
/// Headers of one webhook.
pub const MAX_HEADERS: usize = 16;
/// Recipients of one email rule.
pub const MAX_RECIPIENTS: usize = 16;
/// The longest webhook URL and the longest email address.
pub const MAX_ADDRESS_BYTES: usize = 2048;
/// The longest `late_after`.
pub const MAX_LATE_AFTER: Duration = Duration::from_secs(31 * 24 * 3600);
/// Sends of one notification before it is given up (about an hour and a half of retries).
pub const MAX_SENDS: u32 = 12;
/// The error text a message carries, at most (a run's error can be long).
pub const MAX_ERROR_BYTES: usize = 1024;
/// The shortest and longest `repeat`.
pub const MIN_REPEAT: Duration = Duration::from_secs(1);
pub const MAX_REPEAT: Duration = Duration::from_secs(31 * 24 * 3600);

/// What a notification is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyEvent {
    /// A run ended `failed` (its retries spent).
    Failed,
    /// A run ended `timed_out`.
    TimedOut,
    /// A run succeeded and the job's run before it had failed or timed out.
    Recovered,
    /// An instant was skipped because it was missed (`misfire`).
    Missed,
    /// A run had not started `late_after` past its instant.
    Late,
    /// A run missed one of its job's deadlines (`crate::deadline`); told once per run, for
    /// the first it missed.
    DeadlineMissed,
    /// A run was predicted to miss its `finish_by`, before it did; told once per run.
    AtRisk,
}

string_enum!(NotifyEvent {
    Failed => "failed",
    TimedOut => "timed_out",
    Recovered => "recovered",
    Missed => "missed",
    Late => "late",
    DeadlineMissed => "deadline_missed",
    AtRisk => "at_risk",
});

/// Which failures (`failed`, `timed_out`) of a job a rule tells of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failures {
    /// Every failed or timed-out run.
    #[default]
    Every,
    /// The first of a streak: the job's run before it succeeded (or there was none). With
    /// `repeat`, again while the streak lasts, at most once per that duration.
    First,
}

impl Failures {
    fn is_every(&self) -> bool {
        *self == Failures::Every
    }
}

/// One rule: the events it is for and the one channel they go to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyRule {
    pub on: Vec<NotifyEvent>,
    /// For `late`: how long after its instant a run may wait to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_after: Option<HumanDuration>,
    /// Which failures notify: every one (the default), or the first of a streak.
    #[serde(default, skip_serializing_if = "Failures::is_every")]
    pub failures: Failures,
    /// With `failures: first`: while the job keeps failing, tell again once this long has
    /// passed since the rule last told of one of its failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Webhook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<Email>,
}

/// A JSON POST of the [`Message`] to `url`, with `headers` (which may hold secrets, sealed like
/// a target's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    pub url: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, TargetValue>,
}

/// A plain-text email of the [`Message`] through the server's SMTP relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Email {
    pub to: Vec<String>,
}

/// Where one notification goes: a rule's channel, as it was when the event was recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Channel {
    Webhook(Webhook),
    Email(Email),
}

impl NotifyRule {
    pub fn channel(&self) -> Option<Channel> {
        match (&self.webhook, &self.email) {
            (Some(webhook), None) => Some(Channel::Webhook(webhook.clone())),
            (None, Some(email)) => Some(Channel::Email(email.clone())),
            _ => None,
        }
    }

    /// The delay after which a run that has not started is late, when the rule is for `late`.
    pub fn late_after(&self) -> Option<Duration> {
        self.on
            .contains(&NotifyEvent::Late)
            .then_some(self.late_after?.0)
    }

    pub fn webhook_headers_mut(&mut self) -> impl Iterator<Item = (&String, &mut TargetValue)> {
        self.webhook.iter_mut().flat_map(|w| w.headers.iter_mut())
    }
}

/// Checks a `notify` list; `field` is where it is (`notify`, or a namespace's `notify`).
pub fn validate(field: &str, rules: &[NotifyRule]) -> Result<(), SpecError> {
    if rules.len() > MAX_RULES {
        return Err(SpecError::new(field, format!("at most {MAX_RULES} rules")));
    }
    for (i, rule) in rules.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if rule.on.is_empty() {
            return Err(SpecError::new(
                format!("{at}.on"),
                format!("name at least one of {}", NotifyEvent::one_of()),
            ));
        }
        let mut seen = rule.on.clone();
        seen.sort();
        seen.dedup();
        if seen.len() != rule.on.len() {
            return Err(SpecError::new(format!("{at}.on"), "names an event twice"));
        }
        match (rule.on.contains(&NotifyEvent::Late), rule.late_after) {
            (true, None) => {
                return Err(SpecError::new(
                    format!("{at}.late_after"),
                    "is required for `late`: how long after its instant a run may wait to start",
                ))
            }
            (false, Some(_)) => {
                return Err(SpecError::new(
                    format!("{at}.late_after"),
                    "applies only to `late`, which `on` does not name",
                ))
            }
            (true, Some(after)) if after.0.is_zero() || after.0 > MAX_LATE_AFTER => {
                return Err(SpecError::new(
                    format!("{at}.late_after"),
                    "must be between 1ms and 31 days",
                ))
            }
            _ => {}
        }
        let names_failures = rule
            .on
            .iter()
            .any(|e| matches!(e, NotifyEvent::Failed | NotifyEvent::TimedOut));
        if rule.failures == Failures::First && !names_failures {
            return Err(SpecError::new(
                format!("{at}.failures"),
                "applies to `failed` and `timed_out`, which `on` does not name",
            ));
        }
        match (rule.failures, rule.repeat) {
            (Failures::Every, Some(_)) => {
                return Err(SpecError::new(
                    format!("{at}.repeat"),
                    "applies only with `failures: first` (with `every`, each failure notifies)",
                ))
            }
            (Failures::First, Some(every)) if every.0 < MIN_REPEAT || every.0 > MAX_REPEAT => {
                return Err(SpecError::new(
                    format!("{at}.repeat"),
                    "must be between 1s and 31 days",
                ))
            }
            _ => {}
        }
        match (&rule.webhook, &rule.email) {
            (Some(webhook), None) => {
                let field = format!("{at}.webhook.url");
                if webhook.url.len() > MAX_ADDRESS_BYTES {
                    return Err(SpecError::new(
                        field,
                        format!("must be at most {MAX_ADDRESS_BYTES} bytes"),
                    ));
                }
                check_url(&field, webhook.url.trim())?;
                if webhook.headers.len() > MAX_HEADERS {
                    return Err(SpecError::new(
                        format!("{at}.webhook.headers"),
                        format!("at most {MAX_HEADERS} headers"),
                    ));
                }
                check_headers(&format!("{at}.webhook.headers"), &webhook.headers)?;
            }
            (None, Some(email)) => {
                let field = format!("{at}.email.to");
                if email.to.is_empty() || email.to.len() > MAX_RECIPIENTS {
                    return Err(SpecError::new(
                        field,
                        format!("name 1 to {MAX_RECIPIENTS} addresses"),
                    ));
                }
                if let Some(bad) = email.to.iter().find(|a| !is_email_address(a)) {
                    return Err(SpecError::new(
                        field,
                        format!("{bad:?} is not an email address (local@domain)"),
                    ));
                }
            }
            _ => {
                return Err(SpecError::new(
                    at,
                    "give exactly one channel: `webhook` or `email`",
                ))
            }
        }
    }
    Ok(())
}

/// A plain `local@domain` address: what an SMTP envelope takes, with no display name, spaces,
/// angle brackets or line breaks that could reach the message's headers.
fn is_email_address(text: &str) -> bool {
    let Some((local, domain)) = text.rsplit_once('@') else {
        return false;
    };
    text.len() <= MAX_ADDRESS_BYTES
        && !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && text
            .chars()
            .all(|c| c.is_ascii_graphic() && !"<>()[]\\,;:\"".contains(c) || c == '@')
        && !local.contains('@')
}

/// A run that has just ended, as the rules judge it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndedRun {
    pub state: RunState,
    pub skip_reason: Option<SkipReason>,
    pub scheduled_for: Instant,
    pub started_at: Option<Instant>,
}

/// Whether judging a run that ended in `state` needs the state of the job's run before it: for
/// `recovered` when it succeeded, for a rule that tells only the first failure of a streak
/// when it failed.
pub fn needs_previous(rules: &[NotifyRule], state: RunState) -> bool {
    match state {
        RunState::Succeeded => rules.iter().any(|r| r.on.contains(&NotifyEvent::Recovered)),
        RunState::Failed | RunState::TimedOut => {
            rules.iter().any(|r| r.failures == Failures::First)
        }
        _ => false,
    }
}

fn is_failure(state: Option<RunState>) -> bool {
    matches!(state, Some(RunState::Failed | RunState::TimedOut))
}

/// The rules (by index) that need to know when they last told of a failure of the job, to
/// judge a run that ended in `state` after a run that ended `previous`: those that repeat,
/// when the run continues a streak of failures.
pub fn needs_last_notice(
    rules: &[NotifyRule],
    state: RunState,
    previous: Option<RunState>,
) -> Vec<usize> {
    if !is_failure(Some(state)) || !is_failure(previous) {
        return Vec::new();
    }
    rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.failures == Failures::First && r.repeat.is_some())
        .map(|(i, _)| i)
        .collect()
}

/// Whether a run that failed (or timed out) is told of under `rule`. `previous`: how the job's
/// run before it ended (among succeeded, failed and timed out); `last_notice`: when the rule
/// last told of a failure of the job, when [`needs_last_notice`] asked for it.
///
/// - `failures: every`: always.
/// - `failures: first`: when the run starts a streak (the one before did not fail). Within a
///   streak, with `repeat`, once `repeat` has passed since the last notice, or when there is
///   none to go by (the rule is newer than the streak, or retention took the notice).
pub fn failure_notifies(
    rule: &NotifyRule,
    previous: Option<RunState>,
    last_notice: Option<Instant>,
    now: Instant,
) -> bool {
    match rule.failures {
        Failures::Every => true,
        Failures::First if !is_failure(previous) => true,
        Failures::First => match (rule.repeat, last_notice) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(every), Some(last)) => elapsed(last, now) >= every.0,
        },
    }
}

/// The events the end of `run` raises, by the index of the rule each goes to. `previous` is how
/// the job's run before it ended (among succeeded, failed and timed out), when
/// [`needs_previous`] asked for it; `last_notices` holds, for the rules
/// [`needs_last_notice`] named, when each last told of a failure of the job.
pub fn raised_by_end(
    rules: &[NotifyRule],
    run: &EndedRun,
    previous: Option<RunState>,
    last_notices: &BTreeMap<usize, Instant>,
    now: Instant,
) -> Vec<(usize, NotifyEvent)> {
    let ended_as = match (run.state, run.skip_reason) {
        (RunState::Failed, _) => Some(NotifyEvent::Failed),
        (RunState::TimedOut, _) => Some(NotifyEvent::TimedOut),
        (RunState::Skipped, Some(SkipReason::Misfire)) => Some(NotifyEvent::Missed),
        (RunState::Succeeded, _)
            if matches!(previous, Some(RunState::Failed | RunState::TimedOut)) =>
        {
            Some(NotifyEvent::Recovered)
        }
        _ => None,
    };
    let mut raised = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        if let Some(event) = ended_as.filter(|e| rule.on.contains(e)) {
            let told = match event {
                NotifyEvent::Failed | NotifyEvent::TimedOut => {
                    failure_notifies(rule, previous, last_notices.get(&i).copied(), now)
                }
                _ => true,
            };
            if told {
                raised.push((i, event));
            }
        }
        // A run that started late, however it ended; the notifier's scan catches those still
        // waiting, and the store's key keeps the two from raising it twice.
        let started_late = rule
            .late_after()
            .zip(run.started_at)
            .is_some_and(|(after, started)| elapsed(run.scheduled_for, started) > after);
        if started_late {
            raised.push((i, NotifyEvent::Late));
        }
    }
    raised
}

/// Whether a run of instant `scheduled_for` that has not started is late at `now` under `rule`.
pub fn is_late(rule: &NotifyRule, scheduled_for: Instant, now: Instant) -> bool {
    rule.late_after()
        .is_some_and(|after| elapsed(scheduled_for, now) > after)
}

/// The time from `from` to `to`, none when `to` is earlier.
fn elapsed(from: Instant, to: Instant) -> Duration {
    (to - from).to_std().unwrap_or_default()
}

/// The earliest `late_after` of the rules: a run not started by its instant plus this is late
/// under at least one rule.
pub fn earliest_late_after(rules: &[NotifyRule]) -> Option<Duration> {
    rules.iter().filter_map(NotifyRule::late_after).min()
}

/// What a notification says: the webhook's JSON body, and the email's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub event: NotifyEvent,
    pub namespace: String,
    pub job: String,
    pub run_id: i64,
    /// The run's state when the event was recorded.
    pub state: RunState,
    pub scheduled_for: Instant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<SkipReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// For `deadline_missed` and `at_risk`: which deadline, and how it stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DeadlineNotice>,
    pub at: Instant,
}

/// The deadline a `deadline_missed` or `at_risk` notification is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadlineNotice {
    pub kind: crate::deadline::DeadlineKind,
    /// The deadline's instant (for `max_duration`, the start plus the duration).
    pub deadline: Instant,
    /// Missed: by how much, when it was told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_ms: Option<u64>,
    /// At risk: the finish predicted (none when `warn_before` called it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_finish: Option<Instant>,
}

impl Message {
    /// Keeps a long error to its first [`MAX_ERROR_BYTES`] (on a character boundary).
    pub fn with_error(mut self, error: Option<&str>) -> Self {
        self.error = error.map(|e| {
            let mut end = e.len().min(MAX_ERROR_BYTES);
            while !e.is_char_boundary(end) {
                end -= 1;
            }
            e[..end].to_string()
        });
        self
    }

    /// The subject and body of the email.
    pub fn email_text(&self) -> (String, String) {
        let what = match self.event {
            NotifyEvent::Failed => "failed",
            NotifyEvent::TimedOut => "timed out",
            NotifyEvent::Recovered => "recovered",
            NotifyEvent::Missed => "missed an instant",
            NotifyEvent::Late => "is late",
            NotifyEvent::DeadlineMissed => "missed a deadline",
            NotifyEvent::AtRisk => "is at risk of missing its deadline",
        };
        let subject = format!("[sked] {}/{} {what}", self.namespace, self.job);
        let mut body = format!(
            "Job {job} in namespace {ns} {what}.\n\nrun:           {run}\nstate:         {state}\nscheduled for: {at}\n",
            job = self.job,
            ns = self.namespace,
            run = self.run_id,
            state = self.state,
            at = self
                .scheduled_for
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        );
        if let Some(reason) = self.skip_reason {
            body.push_str(&format!("reason:        {reason}\n"));
        }
        if let Some(error) = &self.error {
            body.push_str(&format!("error:         {error}\n"));
        }
        if let Some(notice) = &self.deadline {
            let at = |t: Instant| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            body.push_str(&format!(
                "deadline:      {} {}\n",
                notice.kind,
                at(notice.deadline)
            ));
            if let Some(by) = notice.by_ms {
                let by = crate::duration::HumanDuration(Duration::from_millis(by));
                body.push_str(&format!("missed by:     {by}\n"));
            }
            if let Some(finish) = notice.estimated_finish {
                body.push_str(&format!("expected end:  {}\n", at(finish)));
            }
        }
        (subject, body)
    }
}

/// Where a notification stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationState {
    /// Waiting to be sent, or to be sent again.
    Pending,
    Sent,
    /// Given up after [`MAX_SENDS`] sends, or refused in a way no retry changes.
    Failed,
}

string_enum!(NotificationState {
    Pending => "pending",
    Sent => "sent",
    Failed => "failed",
});

/// A notification as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationRecord {
    pub id: i64,
    pub namespace: String,
    pub job: String,
    pub run_id: i64,
    pub event: NotifyEvent,
    /// The rule's place in the `notify` list it came from.
    pub rule: u32,
    pub channel: Channel,
    pub message: Message,
    pub state: NotificationState,
    /// Sends tried so far.
    pub sends: u32,
    pub last_error: Option<String>,
    pub created_at: Instant,
    /// When it is due (pending), or when the claim of the node sending it lapses.
    pub next_send_at: Instant,
    pub sent_at: Option<Instant>,
    /// Counts the claims; a node reports a send under the claim it made, so the report of a
    /// node whose claim lapsed and was taken over changes nothing.
    pub claim: i64,
}

/// How one send went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    Sent,
    /// Worth trying again (a refused connection, a 5xx, a 429, a timeout).
    Failed(String),
    /// No retry will change it (a 4xx, a URL the policy refuses, no SMTP relay configured).
    Refused(String),
}

/// What a notification becomes after a send: `(state, sends, next_send_at, last_error)`.
pub fn after_send(
    sends_before: u32,
    outcome: &SendOutcome,
    now: Instant,
) -> (NotificationState, u32, Instant, Option<String>) {
    let sends = sends_before.saturating_add(1);
    match outcome {
        SendOutcome::Sent => (NotificationState::Sent, sends, now, None),
        SendOutcome::Refused(why) => (NotificationState::Failed, sends, now, Some(why.clone())),
        SendOutcome::Failed(why) => match next_send(sends) {
            Some(wait) => (
                NotificationState::Pending,
                sends,
                now + chrono::Duration::from_std(wait).unwrap_or_default(),
                Some(why.clone()),
            ),
            None => (NotificationState::Failed, sends, now, Some(why.clone())),
        },
    }
}

/// How long to wait before the next send after `sends` failed ones, or `None` to give up.
/// Doubling from 5 s, at most 15 min apart.
pub fn next_send(sends: u32) -> Option<Duration> {
    if sends >= MAX_SENDS {
        return None;
    }
    let secs = 5u64.saturating_mul(1u64 << sends.saturating_sub(1).min(20));
    Some(Duration::from_secs(secs.min(15 * 60)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(json: &str) -> Result<Vec<NotifyRule>, String> {
        let rules: Vec<NotifyRule> = serde_json::from_str(json).map_err(|e| e.to_string())?;
        validate("notify", &rules).map_err(|e| format!("{}: {}", e.field, e.message))?;
        Ok(rules)
    }

    fn at(secs: u64) -> Instant {
        Instant::UNIX_EPOCH + chrono::Duration::seconds(1_700_000_000 + secs as i64)
    }

    /// What the end raises with no notice to go by, at a fixed instant.
    fn raised(
        rules: &[NotifyRule],
        run: &EndedRun,
        previous: Option<RunState>,
    ) -> Vec<(usize, NotifyEvent)> {
        raised_by_end(rules, run, previous, &BTreeMap::new(), at(100))
    }

    fn ended(state: RunState) -> EndedRun {
        EndedRun {
            state,
            skip_reason: None,
            scheduled_for: at(0),
            started_at: Some(at(1)),
        }
    }

    #[test]
    fn a_rule_names_events_and_exactly_one_channel() {
        assert!(rules(
            r#"[{"on": ["failed"], "webhook": {"url": "https://hooks.example.com/x"}}]"#
        )
        .is_ok());
        assert!(rules(r#"[{"on": ["failed"], "email": {"to": ["ops@example.com"]}}]"#).is_ok());
        let neither = rules(r#"[{"on": ["failed"]}]"#).unwrap_err();
        assert!(
            neither.starts_with("notify[0]: give exactly one channel"),
            "{neither}"
        );
        let both = rules(
            r#"[{"on": ["failed"], "webhook": {"url": "https://x.example"}, "email": {"to": ["a@b.c"]}}]"#,
        )
        .unwrap_err();
        assert!(both.contains("exactly one channel"), "{both}");
        let none = rules(r#"[{"on": [], "webhook": {"url": "https://x.example"}}]"#).unwrap_err();
        assert!(none.starts_with("notify[0].on"), "{none}");
        let twice =
            rules(r#"[{"on": ["failed", "failed"], "webhook": {"url": "https://x.example"}}]"#)
                .unwrap_err();
        assert!(twice.contains("twice"), "{twice}");
        assert!(
            rules(r#"[{"on": ["exploded"], "webhook": {"url": "https://x.example"}}]"#).is_err()
        );
    }

    #[test]
    fn late_needs_its_delay_and_the_delay_needs_late() {
        let missing =
            rules(r#"[{"on": ["late"], "webhook": {"url": "https://x.example"}}]"#).unwrap_err();
        assert!(
            missing.starts_with("notify[0].late_after: is required"),
            "{missing}"
        );
        let stray = rules(
            r#"[{"on": ["failed"], "late_after": "5m", "webhook": {"url": "https://x.example"}}]"#,
        )
        .unwrap_err();
        assert!(stray.contains("applies only to `late`"), "{stray}");
        let zero = rules(
            r#"[{"on": ["late"], "late_after": "0s", "webhook": {"url": "https://x.example"}}]"#,
        )
        .unwrap_err();
        assert!(zero.contains("between 1ms and 31 days"), "{zero}");
    }

    #[test]
    fn every_input_is_bounded() {
        let rule = r#"{"on": ["failed"], "webhook": {"url": "https://x.example"}}"#;
        let nine = format!("[{}]", [rule; MAX_RULES + 1].join(","));
        assert!(rules(&nine).unwrap_err().contains("at most 8 rules"));
        let long_url = format!(
            r#"[{{"on": ["failed"], "webhook": {{"url": "https://x.example/{}"}}}}]"#,
            "a".repeat(MAX_ADDRESS_BYTES)
        );
        assert!(rules(&long_url).unwrap_err().contains("at most 2048 bytes"));
        let headers: Vec<String> = (0..=MAX_HEADERS)
            .map(|i| format!(r#""X-{i}": "v""#))
            .collect();
        let many = format!(
            r#"[{{"on": ["failed"], "webhook": {{"url": "https://x.example", "headers": {{{}}}}}}}]"#,
            headers.join(",")
        );
        assert!(rules(&many).unwrap_err().contains("at most 16 headers"));
        let recipients: Vec<String> = (0..=MAX_RECIPIENTS)
            .map(|i| format!(r#""a{i}@b.c""#))
            .collect();
        let crowd = format!(
            r#"[{{"on": ["failed"], "email": {{"to": [{}]}}}}]"#,
            recipients.join(",")
        );
        assert!(rules(&crowd).unwrap_err().contains("1 to 16 addresses"));
    }

    #[test]
    fn no_header_or_address_can_smuggle_a_line() {
        let header = rules(
            r#"[{"on": ["failed"], "webhook": {"url": "https://x.example", "headers": {"X-A": "v\r\nHost: evil"}}}]"#,
        )
        .unwrap_err();
        assert!(
            header.starts_with("notify[0].webhook.headers.X-A"),
            "{header}"
        );
        for bad in [
            "ops",
            "ops@",
            "@example.com",
            "ops@example",
            "a b@example.com",
            "ops@example.com\r\nBcc: x@y.z",
            "Ops <ops@example.com>",
        ] {
            let json = serde_json::json!([{"on": ["failed"], "email": {"to": [bad]}}]).to_string();
            assert!(
                rules(&json)
                    .unwrap_err()
                    .contains("is not an email address"),
                "{bad}"
            );
        }
        let scheme =
            rules(r#"[{"on": ["failed"], "webhook": {"url": "file:///etc/passwd"}}]"#).unwrap_err();
        assert!(scheme.starts_with("notify[0].webhook.url"), "{scheme}");
    }

    #[test]
    fn a_run_end_raises_the_events_its_rules_name() {
        let rules = rules(
            r#"[{"on": ["failed", "timed_out", "missed"], "webhook": {"url": "https://x.example"}},
                {"on": ["recovered"], "email": {"to": ["ops@example.com"]}}]"#,
        )
        .unwrap();
        assert_eq!(
            raised(&rules, &ended(RunState::Failed), None),
            [(0, NotifyEvent::Failed)]
        );
        assert_eq!(
            raised(&rules, &ended(RunState::TimedOut), None),
            [(0, NotifyEvent::TimedOut)]
        );
        let missed = EndedRun {
            skip_reason: Some(SkipReason::Misfire),
            started_at: None,
            ..ended(RunState::Skipped)
        };
        assert_eq!(raised(&rules, &missed, None), [(0, NotifyEvent::Missed)]);
        let overlap = EndedRun {
            skip_reason: Some(SkipReason::Overlap),
            ..missed
        };
        assert!(raised(&rules, &overlap, None).is_empty());
        assert!(raised(&rules, &ended(RunState::Cancelled), None).is_empty());
    }

    #[test]
    fn recovered_is_the_first_success_after_a_failure() {
        let rules =
            rules(r#"[{"on": ["recovered"], "webhook": {"url": "https://x.example"}}]"#).unwrap();
        assert!(needs_previous(&rules, RunState::Succeeded));
        assert!(!needs_previous(&rules, RunState::Failed));
        let success = ended(RunState::Succeeded);
        for (previous, expected) in [
            (Some(RunState::Failed), true),
            (Some(RunState::TimedOut), true),
            (Some(RunState::Succeeded), false),
            (None, false),
        ] {
            assert_eq!(
                !raised(&rules, &success, previous).is_empty(),
                expected,
                "{previous:?}"
            );
        }
    }

    #[test]
    fn first_failures_tell_a_streak_once_and_recovery_ends_it() {
        let rules = rules(
            r#"[{"on": ["failed", "timed_out", "recovered"], "failures": "first",
                 "webhook": {"url": "https://x.example"}}]"#,
        )
        .unwrap();
        assert!(needs_previous(&rules, RunState::Failed));
        assert!(needs_previous(&rules, RunState::TimedOut));
        let failed = ended(RunState::Failed);
        // The first failure after a success (or of a new job) is told; the next ones are not.
        for (previous, told) in [
            (None, true),
            (Some(RunState::Succeeded), true),
            (Some(RunState::Failed), false),
            (Some(RunState::TimedOut), false),
        ] {
            assert_eq!(
                !raised(&rules, &failed, previous).is_empty(),
                told,
                "{previous:?}"
            );
        }
        assert!(needs_last_notice(&rules, RunState::Failed, Some(RunState::Failed)).is_empty());
        // Recovery is told, and the next failure starts a new streak.
        assert_eq!(
            raised(&rules, &ended(RunState::Succeeded), Some(RunState::Failed)),
            [(0, NotifyEvent::Recovered)]
        );
    }

    #[test]
    fn a_streak_is_told_again_at_most_every_repeat() {
        let rules = rules(
            r#"[{"on": ["failed"], "failures": "first", "repeat": "1h",
                 "webhook": {"url": "https://x.example"}},
                {"on": ["failed"], "webhook": {"url": "https://y.example"}}]"#,
        )
        .unwrap();
        let failed = ended(RunState::Failed);
        let streak = Some(RunState::Failed);
        assert_eq!(needs_last_notice(&rules, RunState::Failed, streak), [0]);
        assert!(needs_last_notice(&rules, RunState::Failed, Some(RunState::Succeeded)).is_empty());
        assert!(needs_last_notice(&rules, RunState::Succeeded, streak).is_empty());
        let hour = 3600;
        for (last, now, told) in [
            (at(0), at(hour - 1), false),
            (at(0), at(hour), true),
            (at(0), at(5 * hour), true),
        ] {
            let notices = BTreeMap::from([(0, last)]);
            let raised = raised_by_end(&rules, &failed, streak, &notices, now);
            // The second rule tells every failure, whatever the first does.
            let expected: Vec<(usize, NotifyEvent)> = if told {
                vec![(0, NotifyEvent::Failed), (1, NotifyEvent::Failed)]
            } else {
                vec![(1, NotifyEvent::Failed)]
            };
            assert_eq!(raised, expected, "{now}");
        }
        // No notice to go by (a rule newer than the streak): told.
        assert!(failure_notifies(&rules[0], streak, None, at(0)));
        // Without repeat, a streak is told once.
        let once = NotifyRule {
            repeat: None,
            ..rules[0].clone()
        };
        assert!(!failure_notifies(&once, streak, None, at(0)));
        assert!(failure_notifies(
            &once,
            Some(RunState::Succeeded),
            None,
            at(0)
        ));
    }

    #[test]
    fn failures_and_repeat_are_checked() {
        let refused = |json: &str| rules(json).err().unwrap_or_default();
        assert!(refused(
            r#"[{"on": ["failed"], "repeat": "1h", "webhook": {"url": "https://x.example"}}]"#
        )
        .starts_with("notify[0].repeat"));
        assert!(refused(
            r#"[{"on": ["recovered"], "failures": "first", "webhook": {"url": "https://x.example"}}]"#
        )
        .starts_with("notify[0].failures"));
        assert!(refused(
            r#"[{"on": ["failed"], "failures": "first", "repeat": "0s", "webhook": {"url": "https://x.example"}}]"#
        )
        .starts_with("notify[0].repeat"));
        assert!(refused(
            r#"[{"on": ["failed"], "failures": "first", "repeat": "32d", "webhook": {"url": "https://x.example"}}]"#
        )
        .starts_with("notify[0].repeat"));
        assert!(refused(
            r#"[{"on": ["failed"], "failures": "some", "webhook": {"url": "https://x.example"}}]"#
        )
        .contains("unknown variant `some`"));
        // The default is every failure, and it is not written out.
        let every =
            rules(r#"[{"on": ["failed"], "webhook": {"url": "https://x.example"}}]"#).unwrap();
        assert_eq!(every[0].failures, Failures::Every);
        assert!(!serde_json::to_string(&every).unwrap().contains("failures"));
    }

    #[test]
    fn late_is_a_start_past_the_delay_whether_seen_waiting_or_at_the_end() {
        let rules = rules(
            r#"[{"on": ["late"], "late_after": "30s", "webhook": {"url": "https://x.example"}}]"#,
        )
        .unwrap();
        assert!(!is_late(&rules[0], at(0), at(30)));
        assert!(is_late(&rules[0], at(0), at(31)));
        assert_eq!(earliest_late_after(&rules), Some(Duration::from_secs(30)));
        let on_time = ended(RunState::Succeeded);
        assert!(raised(&rules, &on_time, None).is_empty());
        let late = EndedRun {
            started_at: Some(at(45)),
            ..on_time
        };
        assert_eq!(raised(&rules, &late, None), [(0, NotifyEvent::Late)]);
    }

    #[test]
    fn sends_back_off_and_give_up() {
        assert_eq!(next_send(1), Some(Duration::from_secs(5)));
        assert_eq!(next_send(2), Some(Duration::from_secs(10)));
        assert_eq!(next_send(11), Some(Duration::from_secs(900)));
        assert_eq!(next_send(MAX_SENDS), None);
        let total: u64 = (1..MAX_SENDS)
            .filter_map(next_send)
            .map(|d| d.as_secs())
            .sum();
        assert!((3_600..7_200).contains(&total), "{total}");
    }

    #[test]
    fn a_long_error_is_cut_on_a_character_boundary() {
        let message = Message {
            event: NotifyEvent::Failed,
            namespace: "default".into(),
            job: "backup".into(),
            run_id: 7,
            state: RunState::Failed,
            scheduled_for: at(0),
            skip_reason: None,
            error: None,
            deadline: None,
            at: at(1),
        }
        .with_error(Some(&"é".repeat(MAX_ERROR_BYTES)));
        let error = message.error.clone().unwrap();
        assert!(error.len() <= MAX_ERROR_BYTES && error.chars().all(|c| c == 'é'));
        let (subject, body) = message.email_text();
        assert_eq!(subject, "[sked] default/backup failed");
        assert!(body.contains("run:           7"), "{body}");
    }
}
