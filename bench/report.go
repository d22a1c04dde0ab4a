package main

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Metric is a column of a table.
type Metric struct {
	Key    string `json:"key"`
	Label  string `json:"label"`
	Unit   string `json:"unit"`
	Better string `json:"better"` // "higher", "lower" or "" (informational)
	digits int
}

// Stat is one metric of one row over the repetitions.
type Stat struct {
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	N       int       `json:"n"`
	Samples []float64 `json:"samples"` // in repetition order
}

// Row is one subject of a table: a limit, vmshelf or a peer.
type Row struct {
	Subject string           `json:"subject"`
	Role    string           `json:"role"` // limit | vmshelf | peer
	Values  map[string]*Stat `json:"values"`
}

// Ratio compares a vmshelf metric with the same metric of another row of
// the same run: the ratio of the medians, and the range of the ratios of
// the repetitions paired in order (the runs that were closest in time).
type Ratio struct {
	Table     string  `json:"table"`
	Metric    string  `json:"metric"`
	Subject   string  `json:"subject"`
	Versus    string  `json:"versus"`
	VsMetric  string  `json:"versus_metric"`
	Ratio     float64 `json:"ratio"`
	PairedMin float64 `json:"paired_min"`
	PairedMax float64 `json:"paired_max"`
	Better    string  `json:"better"`
}

// Table is one group of measurements.
type Table struct {
	ID      string    `json:"id"`
	Title   string    `json:"title"`
	Note    string    `json:"note"`
	Metrics []Metric  `json:"metrics"`
	Rows    []*Row    `json:"rows"`
	Ratios  []Ratio   `json:"ratios"`
	Details []string  `json:"details,omitempty"`
	started time.Time `json:"-"`
}

// Target is one of the bench's targets with its verdict.
type Target struct {
	Name      string  `json:"name"`
	Measured  float64 `json:"measured"`
	Threshold float64 `json:"threshold"`
	Op        string  `json:"op"` // ">=" or "<="
	Unit      string  `json:"unit"`
	Met       bool    `json:"met"`
	Missing   bool    `json:"missing,omitempty"` // not measured in this run
	From      string  `json:"from"`
}

// Report is docs/bench.json.
type Report struct {
	Mode        string            `json:"mode"`
	Started     time.Time         `json:"started"`
	Seconds     float64           `json:"seconds"`
	Reps        int               `json:"repetitions"`
	Machine     map[string]string `json:"machine"`
	Setup       map[string]string `json:"setup"`
	Tables      []*Table          `json:"tables"`
	Targets     []Target          `json:"targets"`
	OtherLoad   []string          `json:"other_load"`
	Notes       []string          `json:"notes"`
	Errors      []string          `json:"errors,omitempty"`
	machineKeys []string
	setupKeys   []string
}

func (r *Report) table(id, title, note string, metrics ...Metric) *Table {
	t := &Table{ID: id, Title: title, Note: note, Metrics: metrics, started: time.Now()}
	r.Tables = append(r.Tables, t)
	return t
}

func (r *Report) find(id string) *Table {
	for _, t := range r.Tables {
		if t.ID == id {
			return t
		}
	}
	return nil
}

func (r *Report) setMachine(k, v string) {
	if r.Machine == nil {
		r.Machine = map[string]string{}
	}
	if _, ok := r.Machine[k]; !ok {
		r.machineKeys = append(r.machineKeys, k)
	}
	r.Machine[k] = v
}

func (r *Report) setSetup(k, v string) {
	if r.Setup == nil {
		r.Setup = map[string]string{}
	}
	if _, ok := r.Setup[k]; !ok {
		r.setupKeys = append(r.setupKeys, k)
	}
	r.Setup[k] = v
}

func (t *Table) row(subject, role string) *Row {
	for _, r := range t.Rows {
		if r.Subject == subject {
			return r
		}
	}
	r := &Row{Subject: subject, Role: role, Values: map[string]*Stat{}}
	t.Rows = append(t.Rows, r)
	return r
}

// add records one repetition's value of metric for subject.
func (t *Table) add(subject, role, metric string, v float64) {
	r := t.row(subject, role)
	s := r.Values[metric]
	if s == nil {
		s = &Stat{}
		r.Values[metric] = s
	}
	s.Samples = append(s.Samples, v)
}

func (t *Table) stat(subject, metric string) *Stat {
	for _, r := range t.Rows {
		if r.Subject == subject {
			return r.Values[metric]
		}
	}
	return nil
}

func (t *Table) metric(key string) Metric {
	for _, m := range t.Metrics {
		if m.Key == key {
			return m
		}
	}
	return Metric{Key: key, Label: key}
}

func (s *Stat) finish() {
	v := slices.Clone(s.Samples)
	v = slices.DeleteFunc(v, func(x float64) bool { return math.IsNaN(x) || math.IsInf(x, 0) })
	s.N = len(v)
	if len(v) == 0 {
		s.Median, s.Min, s.Max = math.NaN(), math.NaN(), math.NaN()
		return
	}
	slices.Sort(v)
	s.Min, s.Max = v[0], v[len(v)-1]
	if len(v)%2 == 1 {
		s.Median = v[len(v)/2]
	} else {
		s.Median = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
}

// ratio adds subject.metric / versus.vsMetric to the table.
func (t *Table) ratio(metric, subject, versus, vsMetric string) *Ratio {
	a, b := t.stat(subject, metric), t.stat(versus, vsMetric)
	if a == nil || b == nil {
		return nil
	}
	a.finish()
	b.finish()
	r := Ratio{Table: t.ID, Metric: metric, Subject: subject, Versus: versus, VsMetric: vsMetric,
		Ratio: a.Median / b.Median, PairedMin: math.Inf(1), PairedMax: math.Inf(-1), Better: t.metric(metric).Better}
	for i := range min(len(a.Samples), len(b.Samples)) {
		q := a.Samples[i] / b.Samples[i]
		if math.IsNaN(q) || math.IsInf(q, 0) {
			continue
		}
		r.PairedMin, r.PairedMax = math.Min(r.PairedMin, q), math.Max(r.PairedMax, q)
	}
	if math.IsInf(r.PairedMin, 0) {
		r.PairedMin, r.PairedMax = math.NaN(), math.NaN()
	}
	t.Ratios = append(t.Ratios, r)
	return &t.Ratios[len(t.Ratios)-1]
}

func (r *Report) finish() {
	for _, t := range r.Tables {
		for _, row := range t.Rows {
			for _, s := range row.Values {
				s.finish()
			}
		}
	}
}

// ---- output ----

func fmtNum(v float64, digits int) string {
	if math.IsNaN(v) {
		return "–"
	}
	if math.IsInf(v, 0) {
		return "∞"
	}
	return fmt.Sprintf("%.*f", digits, v)
}

func fmtStat(s *Stat, digits int) string {
	if s == nil || s.N == 0 {
		return "–"
	}
	if s.N == 1 || s.Min == s.Max {
		return fmtNum(s.Median, digits)
	}
	return fmt.Sprintf("%s (%s–%s)", fmtNum(s.Median, digits), fmtNum(s.Min, digits), fmtNum(s.Max, digits))
}

// findings is the report's section on where the time and the memory go.
//
//go:embed findings.md
var findings string

func (r *Report) markdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# vmshelf benchmarks\n\n")
	w("Generated by `make bench%s` (`go run ./bench`, see [`bench/README.md`](../bench/README.md)) on %s, %s mode, %d repetition(s) per measurement in alternating order, %.0f s in all. ",
		map[bool]string{true: " QUICK=1", false: ""}[r.Mode == "quick"], r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Mode, r.Reps, r.Seconds)
	w("Each cell is the median over the repetitions with (min–max); ratios are vmshelf's median over the peer's median from this same run, with the range of the ratios of repetitions paired in order. MB/s are 10⁶ bytes per second; GiB and MiB are binary.\n\n")
	if len(r.OtherLoad) > 0 {
		w("> **Other load during this run:** %d process(es) of other work (fuzzers, `go test`, test binaries, the Go compiler) were running at some point (%s). Absolute numbers and the noise between repetitions are affected; ratios from the same run less so.\n\n",
			len(r.OtherLoad), strings.Join(r.OtherLoad, "; "))
	} else {
		w("No other work (fuzzers, `go test`, test binaries, the Go compiler) was seen running during the run (checked every 10 s).\n\n")
	}
	if len(r.Errors) > 0 {
		w("> **Errors:** %s\n\n", strings.Join(r.Errors, "; "))
	}

	w("## Targets\n\n| target | measured | target | met |\n|---|---|---|---|\n")
	for _, t := range r.Targets {
		mark := "✗"
		switch {
		case t.Missing:
			mark = "– (not measured)"
		case t.Met:
			mark = "✓"
		}
		meas := fmtNum(t.Measured, 2)
		if t.Unit != "" && t.Unit != "×" {
			meas += " " + t.Unit
		} else {
			meas += " ×"
		}
		thr := t.Op + " " + fmtNum(t.Threshold, 2) + " " + t.Unit
		w("| %s | %s | %s | %s |\n", t.Name, meas, thr, mark)
	}
	w("\n")

	w("## Machine\n\n| | |\n|---|---|\n")
	for _, k := range r.machineKeys {
		w("| %s | %s |\n", k, r.Machine[k])
	}
	w("\n## Setup\n\n| | |\n|---|---|\n")
	for _, k := range r.setupKeys {
		w("| %s | %s |\n", k, r.Setup[k])
	}
	w("\n")

	for _, t := range r.Tables {
		w("## %s\n\n", t.Title)
		if t.Note != "" {
			w("%s\n\n", t.Note)
		}
		w("| |")
		for _, m := range t.Metrics {
			w(" %s |", m.Label)
		}
		w("\n|---|")
		for range t.Metrics {
			w("---|")
		}
		w("\n")
		for _, row := range t.Rows {
			name := row.Subject
			if row.Role == "vmshelf" {
				name = "**" + name + "**"
			}
			w("| %s |", name)
			for _, m := range t.Metrics {
				w(" %s |", fmtStat(row.Values[m.Key], m.digits))
			}
			w("\n")
		}
		if len(t.Ratios) > 0 {
			w("\n| ratio (vmshelf ÷ other) | median | paired range | better is |\n|---|---|---|---|\n")
			for _, q := range t.Ratios {
				label := t.metric(q.Metric).Label
				if q.VsMetric != q.Metric {
					label += " vs " + t.metric(q.VsMetric).Label
				}
				pr := fmtNum(q.PairedMin, 2) + "–" + fmtNum(q.PairedMax, 2)
				if fmtNum(q.PairedMin, 2) == fmtNum(q.PairedMax, 2) {
					pr = fmtNum(q.PairedMin, 2)
				}
				w("| %s: %s ÷ %s | %s | %s | %s |\n", label, q.Subject, q.Versus, fmtNum(q.Ratio, 2), pr, q.Better)
			}
		}
		for _, d := range t.Details {
			w("\n%s\n", d)
		}
		w("\n")
	}
	// What the profiles found is written by hand (findings.md): it comes
	// from perf runs of the bench's -perf mode, not from this run's
	// figures, and says so with its own dates and commands.
	w("%s\n", strings.TrimSpace(findings))
	w("\n")
	if len(r.Notes) > 0 {
		w("## Notes\n\n")
		for _, n := range r.Notes {
			w("- %s\n", n)
		}
	}
	return b.String()
}

// nf is v for JSON: NaN and ±Inf (no sample, division by zero) are null.
func nf(v float64) any {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return v
}

func (s Stat) MarshalJSON() ([]byte, error) {
	samples := make([]any, len(s.Samples))
	for i, v := range s.Samples {
		samples[i] = nf(v)
	}
	return json.Marshal(map[string]any{"median": nf(s.Median), "min": nf(s.Min), "max": nf(s.Max), "n": s.N, "samples": samples})
}

func (q Ratio) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"table": q.Table, "metric": q.Metric, "subject": q.Subject, "versus": q.Versus,
		"versus_metric": q.VsMetric, "ratio": nf(q.Ratio), "paired_min": nf(q.PairedMin), "paired_max": nf(q.PairedMax), "better": q.Better})
}

func (t Target) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"name": t.Name, "measured": nf(t.Measured), "threshold": t.Threshold, "op": t.Op,
		"unit": t.Unit, "met": t.Met, "measured_in_this_run": !t.Missing, "from": t.From})
}

func marshalReport(r *Report) ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func writeOutputs(r *Report, mdPath, jsonPath string) error {
	r.finish()
	for _, p := range []string{mdPath, jsonPath} {
		if p != "" {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
		}
	}
	if mdPath != "" {
		if err := os.WriteFile(mdPath, []byte(r.markdown()), 0o644); err != nil {
			return err
		}
	}
	if jsonPath != "" {
		b, err := marshalReport(r)
		if err != nil {
			return err
		}
		if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
