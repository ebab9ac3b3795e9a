//! The status page at `/`: one server-rendered HTML page with no external assets (it works
//! offline and behind any proxy), refreshed by the browser every 5 s. It shows this agent, the
//! cluster's agents, the control plane's epoch and position, topics with partitions, retention
//! and throughput, consumer groups with lag, and buckets with requests and estimated cost.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use weir_control::plane::Role;
use weir_control::RegisteredAgent;
use weir_storage::RequestClass;

use crate::broker::Broker;
use crate::http::Observability;

/// Rows of the topic and group tables at most (the page is for people; /metrics has the rest).
const MAX_ROWS: usize = 1000;

/// How often the page's rates are sampled, and over how long they are averaged.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const RATE_WINDOW: usize = 13;

type Totals = Vec<(String, [u64; 4])>;

/// Per-topic totals sampled every few seconds, for rates over the last minute.
#[derive(Debug, Default)]
pub struct Throughput {
    samples: Mutex<VecDeque<(Instant, Totals)>>,
}

impl Throughput {
    fn record(&self, totals: Totals) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push_back((Instant::now(), totals));
        while samples.len() > RATE_WINDOW {
            samples.pop_front();
        }
    }

    /// Per topic: records/s and bytes/s produced, records/s and bytes/s fetched.
    fn rates(&self) -> HashMap<String, [f64; 4]> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let (Some((t0, first)), Some((t1, last))) = (samples.front(), samples.back()) else {
            return HashMap::new();
        };
        let seconds = t1.duration_since(*t0).as_secs_f64();
        if seconds <= 0.0 {
            return HashMap::new();
        }
        let before: HashMap<&str, &[u64; 4]> = first.iter().map(|(t, v)| (t.as_str(), v)).collect();
        last.iter()
            .map(|(topic, now)| {
                let then = before.get(topic.as_str()).copied().unwrap_or(&[0; 4]);
                let rate = std::array::from_fn(|i| now[i].saturating_sub(then[i]) as f64 / seconds);
                (topic.clone(), rate)
            })
            .collect()
    }
}

/// Samples the topic totals every [`SAMPLE_EVERY`] until `stop`.
pub(crate) async fn sample(observed: Arc<Observability>, mut stop: watch::Receiver<bool>) {
    loop {
        if let Some(broker) = observed.live.broker.get() {
            observed.throughput.record(broker.metrics.topic_totals());
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

/// Escapes text for HTML element content and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `1.5 KiB`, `3.2 MiB`, …
fn bytes(n: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

fn duration_ms(ms: i64) -> String {
    if ms < 0 {
        return "forever".into();
    }
    humantime::format_duration(Duration::from_millis(ms as u64)).to_string()
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}\
table{border-collapse:collapse}td,th{padding:.25em .8em;border-bottom:1px solid #ddd;\
text-align:left}td.n,th.n{text-align:right}td.n{white-space:nowrap}.bad{color:#b00}.ok{color:#070}";

/// A table: header cells (those starting with '#' are numeric, right-aligned) and rows.
fn table(out: &mut String, id: &str, header: &[&str], rows: &[Vec<String>]) {
    let _ = write!(out, "<table id=\"{id}\"><tr>");
    let numeric: Vec<bool> = header.iter().map(|h| h.starts_with('#')).collect();
    for h in header {
        let class = if h.starts_with('#') {
            " class=\"n\""
        } else {
            ""
        };
        let _ = write!(out, "<th{class}>{}</th>", esc(h.trim_start_matches('#')));
    }
    out.push_str("</tr>");
    for row in rows {
        out.push_str("<tr>");
        for (cell, &n) in row.iter().zip(&numeric) {
            let class = if n { " class=\"n\"" } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", esc(cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// The page.
pub(crate) fn render(observed: &Observability) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let broker = observed.live.broker.get();
    let title = broker.map_or("Weir agent (starting)".to_string(), |b| {
        format!("Weir agent {}", b.settings.node_id)
    });
    let _ = write!(
        out,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" \
         content=\"5\"><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1>",
        t = esc(&title)
    );
    let readiness = observed.live.readiness();
    let ready = match &readiness {
        Ok(()) => "<span id=\"ready\" class=\"ok\">ready</span>".to_string(),
        Err(reason) => format!(
            "<span id=\"ready\" class=\"bad\">not ready: {}</span>",
            esc(reason)
        ),
    };
    let _ = write!(
        out,
        "<p>Weir {} · up {} · {ready}</p>",
        env!("CARGO_PKG_VERSION"),
        humantime::format_duration(Duration::from_secs(observed.started.elapsed().as_secs()))
    );
    if let Some(broker) = broker {
        agent_sections(&mut out, observed, broker);
    }
    bucket_section(&mut out, observed, broker.map(|b| &**b));
    out.push_str("</body></html>");
    out
}

fn agent_sections(out: &mut String, observed: &Observability, broker: &Broker) {
    let settings = &broker.settings;
    let status = broker.control.leader_status();
    let role = match *broker.control.role().borrow() {
        Role::Leader { .. } => "leader",
        Role::Follower { .. } => "follower",
    };
    out.push_str("<h2>Agent</h2>");
    table(
        out,
        "agent",
        &[
            "node id",
            "Kafka address",
            "zone",
            "control plane",
            "#epoch",
            "#log position",
        ],
        &[vec![
            settings.node_id.to_string(),
            format!("{}:{}", settings.advertised_host, settings.advertised_port),
            settings.rack.clone().unwrap_or_default(),
            role.to_string(),
            status.epoch.to_string(),
            status.durable.to_string(),
        ]],
    );
    let rates = observed.throughput.rates();
    let defaults = settings.retention;
    // Under the state lock only copies of the numbers (the writer waits for it to publish a
    // slot); everything is formatted after.
    let (agents, topics, topic_count, lags) = broker.control.read(|state| {
        let agents: Vec<(i32, RegisteredAgent)> = state
            .registry
            .agents
            .iter()
            .map(|(id, a)| (*id, a.clone()))
            .collect();
        let topics: Vec<(String, usize, i64, i64, i64)> = state
            .topics
            .values()
            .take(MAX_ROWS)
            .map(|topic| {
                let retained = topic
                    .partitions
                    .iter()
                    .map(|p| p.high_watermark - p.log_start_offset)
                    .sum();
                let config = |key: &str, default: i64| {
                    topic
                        .configs
                        .get(key)
                        .and_then(|v| v.parse::<i64>().ok())
                        .unwrap_or(default)
                };
                (
                    topic.name.clone(),
                    topic.partitions.len(),
                    retained,
                    config("retention.ms", defaults.ms),
                    config("retention.bytes", defaults.bytes),
                )
            })
            .collect();
        (agents, topics, state.topics.len(), state.group_lags())
    });
    let agents: Vec<Vec<String>> = agents
        .into_iter()
        .map(|(id, a)| {
            vec![
                id.to_string(),
                format!("{}:{}", a.host, a.port),
                a.zone,
                a.control_address,
            ]
        })
        .collect();
    let topics: Vec<Vec<String>> = topics
        .into_iter()
        .map(
            |(name, partitions, retained, retention_ms, retention_bytes)| {
                let rate = rates.get(&name).copied().unwrap_or_default();
                vec![
                    name,
                    partitions.to_string(),
                    retained.to_string(),
                    format!("{:.0}", rate[0]),
                    bytes(rate[1]),
                    format!("{:.0}", rate[2]),
                    bytes(rate[3]),
                    match retention_bytes {
                        b if b < 0 => duration_ms(retention_ms),
                        b => format!("{} or {}", duration_ms(retention_ms), bytes(b as f64)),
                    },
                ]
            },
        )
        .collect();
    if !agents.is_empty() {
        out.push_str("<h2>Agents</h2>");
        table(
            out,
            "agents",
            &["node id", "Kafka address", "zone", "control address"],
            &agents,
        );
    }
    out.push_str("<h2>Topics</h2>");
    table(
        out,
        "topics",
        &[
            "topic",
            "#partitions",
            "#records retained",
            "#produced records/s",
            "#produced bytes/s",
            "#fetched records/s",
            "#fetched bytes/s",
            "retention",
        ],
        &topics,
    );
    more(out, topic_count, topics.len(), "topics");
    out.push_str("<p>Rates: this agent, over the last minute.</p><h2>Consumer groups</h2>");
    let groups: Vec<Vec<String>> = lags
        .iter()
        .take(MAX_ROWS)
        .map(|l| vec![l.group.clone(), l.partitions.to_string(), l.lag.to_string()])
        .collect();
    table(out, "groups", &["group", "#partitions", "#lag"], &groups);
    more(out, lags.len(), groups.len(), "groups");
}

/// Says how many rows a capped table left out.
fn more(out: &mut String, all: usize, shown: usize, what: &str) {
    if all > shown {
        let _ = write!(
            out,
            "<p>… and {} more {what} (the first {shown} by name are shown).</p>",
            all - shown
        );
    }
}

fn bucket_section(out: &mut String, observed: &Observability, broker: Option<&Broker>) {
    out.push_str("<h2>Buckets</h2>");
    let answers: HashMap<String, Option<Result<(), String>>> = observed
        .live
        .sources
        .readiness
        .answers()
        .into_iter()
        .collect();
    let mut total = 0.0;
    let rows: Vec<Vec<String>> = observed
        .live
        .sources
        .storage
        .snapshot()
        .iter()
        .map(|b| {
            total += b.cost();
            let probe = match answers.get(&b.name) {
                Some(Some(Ok(()))) => "answers".to_string(),
                Some(Some(Err(err))) => format!("failing: {err}"),
                Some(None) => "not probed yet".to_string(),
                None => String::new(),
            };
            let mut row = vec![b.name.clone(), b.price_class.clone(), probe];
            row.extend(
                RequestClass::ALL
                    .iter()
                    .map(|&c| b.requests_of(c).to_string()),
            );
            row.push(bytes(b.bytes_up as f64));
            row.push(bytes(b.bytes_down as f64));
            row.push(format!("${:.6}", b.cost()));
            row
        })
        .collect();
    table(
        out,
        "buckets",
        &[
            "bucket",
            "prices",
            "probe",
            "#PUT",
            "#GET",
            "#LIST",
            "#DELETE",
            "#HEAD",
            "#up",
            "#down",
            "#est. cost",
        ],
        &rows,
    );
    let produced = broker.map_or(0, |b| b.metrics.produced_bytes_total());
    let per_gib = match crate::metrics::cost_per_gib(total, produced) {
        Some(dollars) => format!("${dollars:.6} per GiB produced"),
        None => "nothing produced yet".to_string(),
    };
    let _ = write!(
        out,
        "<p id=\"cost\">Estimated object-store cost since start: ${total:.6} ({per_gib}). \
         Request counts are attempts, as billed.</p>"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_escapes_markup() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
    }

    #[test]
    fn test_bytes_are_human() {
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
    }
}
