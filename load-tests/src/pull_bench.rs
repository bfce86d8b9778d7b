//! What reading a durable consumer costs, per message, the two ways the bus offers:
//! `Bus::pull` (a fetch request per batch, acks confirmed) and `Bus::pull_ahead` (one standing
//! subscription, acks only sent), as the webhook fan-out reads the public stream.
//!
//! Messages are published at a steady pace (not all at once, which would let either way take
//! them in big batches) and taken as the fan-out takes them: `next`, then whatever
//! `next_buffered` holds, each acked. Rounds of the two ways alternate on one nats-server, and
//! the figures are on-CPU time per message of the server and of this process (publisher and
//! consumer together), so the ratio of the two ways is taken on the same machine minutes
//! apart.

use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_bus::jetstream;
use differently_bus::testing::NatsServer;
use differently_bus::{Bus, Pull};
use differently_bus_schema::{ConsumerDef, Naming};
use serde::Serialize;

use crate::cpu::CpuMeter;
use crate::stats::percentile;
use crate::LoadError;

/// [`CpuMeter`]'s name for the run's own nats-server (its `nats-server` group sums every
/// such process on the machine). The meter reads clock ticks, which keep the time of
/// threads that ended (summing live threads' `schedstat` loses it, and a round's figure
/// could then go negative); a round takes seconds of CPU, so 10 ms steps are fine.
const SERVER: &str = "the run's nats-server";

/// [`CpuMeter`]'s name for this process.
const CLIENT: &str = "load generator";

/// One way of reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Way {
    /// `Bus::pull`.
    Pull,
    /// `Bus::pull_ahead`.
    Ahead,
}

/// Options of a run.
#[derive(Debug, Clone)]
pub struct PullBenchOpts {
    /// Rounds per way (alternated).
    pub rounds: usize,
    /// Messages per round.
    pub messages: usize,
    /// Pause between two publishes (one exec's two events come together, so pairs are sent
    /// back to back and the pause falls between pairs).
    pub pace: Duration,
}

/// One round's figures.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Round {
    pub way: Way,
    /// nats-server's on-CPU µs per message.
    pub server_us: f64,
    /// This process's on-CPU µs per message (publishing and reading).
    pub client_us: f64,
    /// Messages taken through `next_buffered` (rather than `next`).
    pub buffered: usize,
}

/// The run's report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PullBenchReport {
    pub rounds: Vec<Round>,
    /// Median of `Ahead` rounds over median of `Pull` rounds, for the server.
    pub server_ratio: f64,
    /// The same for this process.
    pub client_ratio: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// Runs the benchmark on a nats-server of its own (≥ 2.10, as the harness finds it).
pub async fn run(opts: PullBenchOpts) -> Result<PullBenchReport, LoadError> {
    if opts.rounds == 0 || opts.messages < 2 {
        return Err(LoadError::Plan(
            "at least one round of two messages".to_owned(),
        ));
    }
    differently_bus::testing::find_nats_server().map_err(LoadError::Preflight)?;
    let server = NatsServer::start();
    let server_pid = server
        .pid()
        .ok_or_else(|| LoadError::Preflight("the nats-server has no pid".to_owned()))?;
    let bus = jetstream::connect(&server.url(), 1)
        .await
        .map_err(|e| LoadError::Preflight(format!("connect to {}: {e}", server.url())))?;
    let naming = Naming::new("bench").map_err(|e| LoadError::Plan(e.to_string()))?;
    bus.ensure_streams(&naming)
        .await
        .map_err(|e| LoadError::Preflight(format!("streams: {e}")))?;
    let mut rounds = Vec::new();
    for r in 0..opts.rounds * 2 {
        // Alternate which goes first, so neither always follows the other.
        let way = match (r + r / 2) % 2 {
            0 => Way::Pull,
            _ => Way::Ahead,
        };
        // A subject of its own per round, so each round's consumer sees only its messages.
        let def = ConsumerDef {
            stream: naming.public_stream().name,
            durable: format!("bench-{r}"),
            filter: format!("{}.pub.round{r}.>", naming.prefix()),
            ack_wait: Duration::from_secs(30),
        };
        rounds.push(round(&bus, &naming, &def, way, r, &opts, server_pid).await?);
    }
    let of = |way: Way, f: fn(&Round) -> f64| {
        median(rounds.iter().filter(|r| r.way == way).map(f).collect())
    };
    Ok(PullBenchReport {
        server_ratio: of(Way::Ahead, |r| r.server_us) / of(Way::Pull, |r| r.server_us),
        client_ratio: of(Way::Ahead, |r| r.client_us) / of(Way::Pull, |r| r.client_us),
        rounds,
    })
}

async fn round(
    bus: &jetstream::JetStreamBus,
    naming: &Naming,
    def: &ConsumerDef,
    way: Way,
    r: usize,
    opts: &PullBenchOpts,
    server_pid: u32,
) -> Result<Round, LoadError> {
    let consume = |e: differently_bus::BusError| LoadError::Check(format!("{way:?}: {e}"));
    let mut pull: Box<dyn Pull> = match way {
        Way::Pull => bus.pull(def).await,
        Way::Ahead => bus.pull_ahead(def).await,
    }
    .map_err(consume)?;
    let subject = format!("{}.pub.round{r}.exec", naming.prefix());
    let meter = CpuMeter::start(vec![(SERVER.to_owned(), server_pid)]);
    let publisher = {
        let (bus, subject, opts) = (bus.clone(), subject.clone(), opts.clone());
        tokio::spawn(async move {
            for i in 0..opts.messages {
                let body = Bytes::from(format!("{{\"round\":{r},\"n\":{i}}}"));
                bus.publish(&subject, &format!("r{r}-m{i}"), body).await?;
                if i % 2 == 1 {
                    tokio::time::sleep(opts.pace).await;
                }
            }
            Ok::<_, differently_bus::BusError>(())
        })
    };
    let (mut got, mut buffered) = (0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    while got < opts.messages {
        if Instant::now() > deadline {
            return Err(LoadError::Timeout(format!(
                "{way:?}: {got} of {} messages in 60 s",
                opts.messages
            )));
        }
        let Some(d) = pull.next(Duration::from_secs(1)).await.map_err(consume)? else {
            continue;
        };
        d.acker.ack().await.map_err(consume)?;
        got += 1;
        while let Some(d) = pull.next_buffered().await.map_err(consume)? {
            d.acker.ack().await.map_err(consume)?;
            got += 1;
            buffered += 1;
        }
    }
    publisher
        .await
        .map_err(|e| LoadError::Check(format!("publisher: {e}")))?
        .map_err(|e| LoadError::Check(format!("publish: {e}")))?;
    let used = meter.finish_seconds();
    let per = |name: &str| -> Result<f64, LoadError> {
        let seconds = used
            .get(name)
            .ok_or_else(|| LoadError::Check(format!("on-CPU time of {name} could not be read")))?;
        Ok(seconds * 1e6 / opts.messages as f64)
    };
    Ok(Round {
        way,
        server_us: per(SERVER)?,
        client_us: per(CLIENT)?,
        buffered,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short run takes every message of every round both ways (a round that misses one
    /// fails the run) and reads the server's and its own CPU.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_run_takes_everything_both_ways() {
        let r = run(PullBenchOpts {
            rounds: 1,
            messages: 40,
            pace: Duration::from_millis(1),
        })
        .await
        .expect("pull bench");
        let ways: Vec<Way> = r.rounds.iter().map(|r| r.way).collect();
        assert_eq!(ways, [Way::Pull, Way::Ahead]);
        // A short round may take less than a clock tick of CPU, and other tests share this
        // process: the figures are only read here, not judged.
        for round in &r.rounds {
            assert!(
                round.server_us >= 0.0 && round.client_us >= 0.0,
                "{round:?}"
            );
        }
    }

    #[test]
    fn the_median_is_the_middle_rank_whatever_the_order() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![5.0, 1.0, 4.0, 2.0, 3.0]), 3.0);
    }
}
