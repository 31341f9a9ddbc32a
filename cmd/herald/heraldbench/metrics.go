package heraldbench

import (
	"context"
	"fmt"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/heraldpush/herald/api/client"
)

// ScrapeMetrics reads a Herald process's /metrics (herald bench and the
// tests read what a process counted).
func ScrapeMetrics(base string) (map[string]*dto.MetricFamily, error) {
	c, err := client.NewClient(base)
	if err != nil {
		return nil, err
	}
	resp, err := c.GetMetrics(context.Background())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// MetricSum adds up the series of one family whose labels include labels: a
// counter's or gauge's value, a histogram's sample count.
func MetricSum(families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	var sum float64
	for _, m := range families[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			match = match && have[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// UnansweredSends is how many provider requests of the Herald process at
// base got no answer (herald_provider_request_seconds, outcome no_answer):
// pushes the provider may have taken, which the process sends again.
func UnansweredSends(base string) (int64, error) {
	families, err := ScrapeMetrics(base)
	if err != nil {
		return 0, err
	}
	return int64(MetricSum(families, "herald_provider_request_seconds", map[string]string{"outcome": "no_answer"})), nil
}
