//go:build !race && linux

package httpapi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testwait"
)

// BenchmarkScrapeCost is what serving /metrics costs the requests:
// requests per second through a router, a prefill and a decode node on
// loopback (KV over the data plane), with a scraper reading every node's
// /metrics every 100 ms and, alternating in the same run, with none; it
// reports both, on/off (the throughput kept while scraped, over the whole
// run and as the median of adjacent pairs) and cpu-off/on (the process's
// CPU per request without scrapes over with them). The scraper is a process
// of its own, as Prometheus is, paused while scraping is off; on this
// machine it competes for the same cores. The counters themselves stay on
// either way: they are what a scrape reads. Run with:
//
//	go test ./httpapi -run '^$' -bench ScrapeCost -benchtime 100x
func BenchmarkScrapeCost(b *testing.B) {
	n := startTrio(b, nil)
	scraper := startScraper(b, n.ps.URL+"/metrics", n.ds.URL+"/metrics", n.rs.URL+"/metrics")
	const (
		streams   = 4  // concurrent clients
		perStream = 25 // requests each, per round
	)
	clients := make([]*client.Client, streams)
	for i := range clients {
		clients[i] = dial(b, n.r)
	}
	// A round of streams × perStream requests of a 64-token prompt and 8
	// tokens each, all clients at once.
	prompt := fmt.Sprintf("%064d", 0)
	round := func() time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Go(func() {
				for range perStream {
					if _, err := c.Generate(context.Background(), "bench", prompt, client.GenerateOptions{MaxTokens: 8}, nil); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	round() // connections, pools and caches warm before the measurement
	var on, off, onCPU, offCPU time.Duration
	var pairs []float64 // each pair's off/on
	for b.Loop() {
		// Short rounds, alternating, each order half the time: the
		// machine's drift falls on both sides alike, and the median of
		// the pairs' ratios ignores a pair another process disturbed.
		var took [2]time.Duration
		for i := range 2 {
			scraped := (len(pairs)+i)%2 == 0
			scraper.run(scraped)
			cpu0 := processCPU(b)
			if scraped {
				took[1] = round()
				onCPU += processCPU(b) - cpu0
			} else {
				took[0] = round()
				offCPU += processCPU(b) - cpu0
			}
		}
		scraper.run(false)
		off, on = off+took[0], on+took[1]
		pairs = append(pairs, took[0].Seconds()/took[1].Seconds())
	}
	slices.Sort(pairs)
	requests := float64(len(pairs) * streams * perStream)
	b.ReportMetric(requests/on.Seconds(), "scraped-req/s")
	b.ReportMetric(requests/off.Seconds(), "unscraped-req/s")
	b.ReportMetric(off.Seconds()/on.Seconds(), "on/off")
	b.ReportMetric(pairs[len(pairs)/2], "median-on/off")
	b.ReportMetric(offCPU.Seconds()/onCPU.Seconds(), "cpu-off/on")
	b.ReportMetric(float64(scraper.scrapes.Load())/on.Seconds(), "scrapes/s")
}

// scraper is the process TestScraperProcess runs in, stopped (SIGSTOP)
// while scraping is off.
type scraper struct {
	b       *testing.B
	cmd     *exec.Cmd
	running bool
	scrapes atomic.Int64 // the lines it printed, one a scrape
}

func startScraper(b *testing.B, urls ...string) *scraper {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestScraperProcess$")
	cmd.Env = append(os.Environ(), "KVWARDEN_SCRAPE="+strings.Join(urls, " "))
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &scraper{b: b, cmd: cmd, running: true}
	go func() {
		for sc := bufio.NewScanner(out); sc.Scan(); {
			if sc.Text() == "scraped" {
				s.scrapes.Add(1)
			}
		}
	}()
	b.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	s.run(false)
	return s
}

// run resumes or stops the scraper.
func (s *scraper) run(on bool) {
	if on == s.running {
		return
	}
	sig := syscall.SIGSTOP
	if on {
		sig = syscall.SIGCONT
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.b.Fatal(err)
	}
	s.running = on
}

// TestScraperProcess is BenchmarkScrapeCost's scraper when the benchmark
// starts this binary as one: it reads each URL of KVWARDEN_SCRAPE every
// 100 ms until killed, printing a line per read. Run as a test, it has
// nothing to do.
func TestScraperProcess(t *testing.T) {
	urls := strings.Fields(os.Getenv("KVWARDEN_SCRAPE"))
	if len(urls) == 0 {
		t.Skip("the scraper of BenchmarkScrapeCost, which starts it")
	}
	for tick := time.NewTicker(100 * time.Millisecond); ; <-tick.C {
		for _, u := range urls {
			res, err := http.Get(u)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			fmt.Println("scraped")
		}
	}
}

// processCPU is the CPU time the process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// BenchmarkScrape is one scrape of an idle decode node's /metrics, over
// loopback HTTP, and the CPU it costs this process (the node's side and
// the client's): what BenchmarkScrapeCost's scraper costs per read. Run
// with:
//
//	go test ./httpapi -run '^$' -bench 'Scrape$'
func BenchmarkScrape(b *testing.B) {
	p, _ := startAs(b, actors.RolePrefill, nil)
	d, ds := startAs(b, actors.RoleDecode, nil, p.GossipAddr())
	testwait.For(b, "the decode node sees the prefill node", 10*time.Second, func() bool { return d.Ready() == nil })
	b.ReportAllocs()
	cpu0, n := processCPU(b), 0
	for b.Loop() {
		res, err := http.Get(ds.URL + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		n++
	}
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(n)/1e6, "cpu-ms/scrape")
}
