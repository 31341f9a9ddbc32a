package jobs

import (
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// PoolMetrics export the statistics of a process's PostgreSQL pools
// (pgxpool.Stat), by pool: the process's own and each lane's of its own.
type PoolMetrics struct {
	mu                                             sync.Mutex
	pools                                          map[string]*pgxpool.Pool
	conns, max, acquires, emptyAcquires, waitTotal *prometheus.Desc
}

// NewPoolMetrics registers the pools' statistics on reg; Add names each
// pool.
func NewPoolMetrics(reg prometheus.Registerer) *PoolMetrics {
	c := &PoolMetrics{
		pools: map[string]*pgxpool.Pool{},
		conns: prometheus.NewDesc("herald_db_pool_connections",
			"The pool's connections, by state: acquired (in use), idle, constructing.", []string{"pool", "state"}, nil),
		max: prometheus.NewDesc("herald_db_pool_max_connections",
			"The most connections the pool opens.", []string{"pool"}, nil),
		acquires: prometheus.NewDesc("herald_db_pool_acquires_total",
			"Connections taken from the pool.", []string{"pool"}, nil),
		emptyAcquires: prometheus.NewDesc("herald_db_pool_empty_acquires_total",
			"Connections taken that had to wait, none being idle: a pool too small for its work shows here.", []string{"pool"}, nil),
		waitTotal: prometheus.NewDesc("herald_db_pool_acquire_seconds_total",
			"Time spent taking connections from the pool, waits included.", []string{"pool"}, nil),
	}
	reg.MustRegister(c)
	return c
}

// Add exports pool's statistics under name.
func (c *PoolMetrics) Add(name string, pool *pgxpool.Pool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pools[name] = pool
}

// Describe implements prometheus.Collector.
func (c *PoolMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.max, c.acquires, c.emptyAcquires, c.waitTotal} {
		ch <- d
	}
}

// Collect implements prometheus.Collector from each pool's own counters:
// no query.
func (c *PoolMetrics) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, p := range c.pools {
		s := p.Stat()
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.AcquiredConns()), name, "acquired")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.IdleConns()), name, "idle")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.ConstructingConns()), name, "constructing")
		ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.MaxConns()), name)
		ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(c.emptyAcquires, prometheus.CounterValue, float64(s.EmptyAcquireCount()), name)
		ch <- prometheus.MustNewConstMetric(c.waitTotal, prometheus.CounterValue, s.AcquireDuration().Seconds(), name)
	}
}
