//! The report as Markdown for people (JSON comes from its `Serialize`).

use super::*;

impl Report {
    /// create→running and CPU per session by offered rate: the sweep and the main phase.
    fn sweep_table(&self) -> String {
        let p = &self.phases;
        let main = SweepPoint {
            rate: self.plan.rate,
            sessions: p.fixed_rate.clone(),
            server_side_to_running: p.server_side_to_running.clone(),
            cpu_cores: p.fixed_rate_cpu_cores.clone(),
            cpu_wall_seconds: p.fixed_rate_cpu_wall_seconds,
        };
        let mut points: Vec<&SweepPoint> = p.rate_sweep.iter().chain([&main]).collect();
        points.sort_by_key(|x| x.rate);
        let mut out = String::from(
            "\ncreate→running by offered rate (each a fixed-rate phase; the main one included):\n\n\
             | offered /s | achieved /s | sessions | failed | create p50 ms | create→running p50 ms (client) | p99 ms | p50 ms (Postgres) | cores busy | CPU ms per session |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for x in points {
            let s = &x.sessions;
            out.push_str(&format!(
                "| {} | {:.0} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |\n",
                x.rate,
                s.achieved_rate,
                s.started,
                s.failed,
                s.admit.p50_ms,
                s.to_running.p50_ms,
                s.to_running.p99_ms,
                x.server_side_to_running.p50_ms,
                x.cpu_cores.values().sum::<f64>(),
                x.cpu_ms_per_session(),
            ));
        }
        out
    }

    /// The human-readable form: Markdown tables of figures, targets and invariants.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "Differently load run — {} orgs × {} live sandboxes, tenancy: {}, {} CPUs, wall {:.0} s{}\n\n",
            self.plan.orgs,
            self.plan.live_per_org,
            self.tenancy.mode,
            self.environment.cpus,
            self.wall_seconds,
            if self.plan.smoke { " (SMOKE: numbers are not meaningful)" } else { "" }
        ));
        out.push_str("| figure | value | unit | baseline | baseline value | ratio |\n|---|---:|---|---|---:|---:|\n");
        for f in &self.figures {
            let value = match (&f.value, &f.note) {
                (None, Some(n)) => n.clone(),
                _ => num(f.value),
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                f.name,
                value,
                f.unit,
                f.baseline,
                num(f.baseline_value),
                f.ratio.map_or("—".to_owned(), |r| format!("{r:.3}×"))
            ));
        }
        out.push_str("\n| target | goal | verdict | measured |\n|---|---|---|---|\n");
        for t in &self.targets {
            out.push_str(&format!(
                "| {} | {} | **{}** | {} |\n",
                t.id, t.target, t.status, t.measured
            ));
        }
        let i = &self.invariants;
        let line = |name: &str, c: &crate::invariants::Check| {
            format!(
                "| {name} | {} | {} | {} |\n",
                if c.ok { "ok" } else { "VIOLATED" },
                c.violations,
                c.examples.join("; ")
            )
        };
        out.push_str(&format!(
            "\nInvariants ({} sandboxes expected, {} rows, {} ledger lines, {} unsettled): **{}**\n\n| invariant | result | violations | examples |\n|---|---|---:|---|\n",
            i.sandboxes_expected,
            i.rows_in_postgres,
            i.ledger_lines,
            i.unsettled_rows,
            if i.ok { "all hold" } else { "VIOLATED" }
        ));
        out.push_str(&line("no sandbox lost", &i.no_sandbox_lost));
        out.push_str(&line(
            "no duplicate backend instance",
            &i.no_duplicate_instance,
        ));
        out.push_str(&line("no orphan backend instance", &i.no_orphan_instance));
        out.push_str(&line(
            &format!(
                "quota never exceeded (max_active {}, peak {})",
                i.max_active_limit,
                i.max_active_seen.values().max().copied().unwrap_or(0)
            ),
            &i.quota_never_exceeded,
        ));
        out.push_str(&line("every delete finished", &i.every_delete_finished));
        let acts = [
            (
                "sustained burst",
                &self.phases.burst_sustained.postgres_activity,
            ),
            (
                "leader backlog burst",
                &self.phases.burst_leader_backlog.postgres_activity,
            ),
            (
                "fixed-rate phase",
                &self.phases.fixed_rate_postgres_activity,
            ),
            (
                "quiet exec measurement (server-wide: any database, autovacuum, checkpointer)",
                &self.phases.exec_postgres_activity,
            ),
        ];
        let fr = &self.phases;
        if !fr.rate_sweep.is_empty() {
            out.push_str(&self.sweep_table());
        }
        let windows = [
            (
                "the sustained burst, first create until all ran",
                &fr.burst_sustained.cpu_cores,
                fr.burst_sustained.cpu_wall_seconds,
                fr.burst_sustained.admissions.ops,
                ("sandbox", "sandboxes"),
            ),
            (
                "the leader backlog burst, first create until all ran",
                &fr.burst_leader_backlog.cpu_cores,
                fr.burst_leader_backlog.cpu_wall_seconds,
                fr.burst_leader_backlog.admissions.ops,
                ("sandbox", "sandboxes"),
            ),
            (
                "the fixed-rate phase, first session until the last finished",
                &fr.fixed_rate_cpu_cores,
                fr.fixed_rate_cpu_wall_seconds,
                fr.fixed_rate.started as u64,
                ("session", "sessions"),
            ),
        ];
        for (name, cores_by, wall, ops, (per, plural)) in windows {
            if cores_by.is_empty() {
                continue;
            }
            let total: f64 = cores_by.values().sum();
            out.push_str(&format!(
                "\nCPU during {name} ({wall:.1} s, {ops} {plural}; `/proc/<pid>/stat`):\n\n| process | cores | CPU ms per {per} |\n|---|---:|---:|\n",
            ));
            let mut rows: Vec<(&String, &f64)> = cores_by.iter().collect();
            rows.sort_by(|x, y| y.1.total_cmp(x.1));
            for (who, cores) in rows {
                out.push_str(&format!(
                    "| {who} | {cores:.2} | {:.3} |\n",
                    cpu_ms_per_op(*cores, wall, ops)
                ));
            }
            out.push_str(&format!(
                "| all | {total:.2} | {:.3} |\n",
                cpu_ms_per_op(total, wall, ops)
            ));
        }
        out.push_str(&fr.structure.render());
        if let Some(i) = &fr.instructions {
            out.push_str(&i.render());
        }
        for (name, act) in acts {
            if act.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "\nPostgres backends of the control plane during the {name} (sampled every 50 ms; top 5):\n\n| backends/sample | state · wait · query |\n|---:|---|\n"
            ));
            for w in act.iter().take(5) {
                out.push_str(&format!(
                    "| {:.2} | `{}` |\n",
                    w.backends_per_sample,
                    w.what.replace('|', "·")
                ));
            }
        }
        if !self.notes.is_empty() {
            out.push_str("\nNotes:\n");
            for n in &self.notes {
                out.push_str(&format!("- {n}\n"));
            }
        }
        out
    }
}
