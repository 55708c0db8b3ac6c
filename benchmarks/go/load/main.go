// The load generator of benchmarks/proxy_overhead.py's throughput mode: N concurrent MCP clients over
// streamable HTTP, each on its own kept-alive connection, each a loop of tools/call POSTs after its own
// initialize handshake (its session id and protocol version sent with every call, as an MCP client does).
// Calls completed during -warmup are not counted; then, for -duration, every completed call and its latency are. Prints one JSON
// object: calls per second and latency percentiles in microseconds. Any failed call (status, transport error,
// an answer without its result) is an error: counted, the first one printed, exit status 1.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const protocol = "2025-11-25"

type client struct {
	http    *http.Client
	url     string
	session string
	version string
}

func (c *client) post(body []byte) (*http.Response, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
	}
	if c.version != "" {
		req.Header.Set("Mcp-Protocol-Version", c.version)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, data, err
}

func (c *client) initialize() error {
	init := fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,`+
		`"capabilities":{},"clientInfo":{"name":"proxy-overhead-load","version":"1"}}}`, protocol)
	resp, data, err := c.post([]byte(init))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(data, []byte(`"protocolVersion"`)) {
		return fmt.Errorf("initialize: status %d: %.200s", resp.StatusCode, data)
	}
	c.session = resp.Header.Get("Mcp-Session-Id")
	c.version = protocol
	resp, _, err = c.post([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("notifications/initialized: status %d", resp.StatusCode)
	}
	return nil
}

func (c *client) close() {
	if c.session == "" {
		return
	}
	req, err := http.NewRequest(http.MethodDelete, c.url, nil)
	if err != nil {
		return
	}
	req.Header.Set("Mcp-Session-Id", c.session)
	req.Header.Set("Mcp-Protocol-Version", c.version)
	if resp, err := c.http.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i].Nanoseconds()) / 1000
}

func main() {
	target := flag.String("url", "", "the MCP endpoint, e.g. http://127.0.0.1:8000/mcp")
	clients := flag.Int("clients", 8, "concurrent clients, each on its own connection")
	duration := flag.Duration("duration", 3*time.Second, "how long calls are counted")
	warmup := flag.Duration("warmup", 500*time.Millisecond, "calls before counting starts")
	tool := flag.String("tool", "weather", "the tool to call")
	arguments := flag.String("arguments", "{}", "the call's arguments, a JSON object")
	total := flag.Int64("calls", 0, "if set: count this many calls after the warm-up, however long they take")
	flag.Parse()
	if *target == "" || *clients < 1 || !json.Valid([]byte(*arguments)) {
		fmt.Fprintln(os.Stderr, "usage: load -url URL [-clients N] [-duration D] [-warmup D] [-tool NAME] [-arguments JSON]")
		os.Exit(2)
	}
	peers := make([]*client, *clients)
	for i := range peers {
		transport := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
		peers[i] = &client{http: &http.Client{Transport: transport, Timeout: 30 * time.Second}, url: *target}
		if err := peers[i].initialize(); err != nil {
			fmt.Fprintln(os.Stderr, "load:", err)
			os.Exit(1)
		}
	}
	var (
		wg       sync.WaitGroup
		errors   atomic.Int64
		firstErr sync.Once
		bodySize atomic.Int64
		counted  atomic.Int64
		answered atomic.Int64 // every tools/call answered, warm-up included
	)
	start := time.Now()
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*duration)
	if *total > 0 {
		end = measureFrom.Add(24 * time.Hour)
	}
	var started atomic.Int64 // calls begun after the warm-up (-calls)
	latencies := make([][]time.Duration, *clients)
	for i, c := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := make([]time.Duration, 0, 4096)
			for id := 1; ; id++ {
				body := []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":` +
					strconv.Quote(*tool) + `,"arguments":` + *arguments + `}}`)
				began := time.Now()
				if !began.Before(end) || (*total > 0 && !began.Before(measureFrom) && started.Add(1) > *total) {
					break
				}
				resp, data, err := c.post(body)
				took := time.Since(began)
				if err == nil && (resp.StatusCode != http.StatusOK || !bytes.Contains(data, []byte(`"result"`)) ||
					!bytes.Contains(data, []byte(`"id":`+strconv.Itoa(id)))) {
					err = fmt.Errorf("tools/call: status %d: %.200s", resp.StatusCode, data)
				}
				if err != nil {
					errors.Add(1)
					firstErr.Do(func() { fmt.Fprintln(os.Stderr, "load:", err) })
					continue
				}
				answered.Add(1)
				if finished := began.Add(took); !finished.Before(measureFrom) && finished.Before(end) {
					own = append(own, took) // calls completed within the window
					bodySize.Add(int64(len(data)))
					counted.Add(1)
				}
			}
			latencies[i] = own
		}()
	}
	wg.Wait()
	for _, c := range peers {
		c.close()
	}
	seconds := duration.Seconds()
	if *total > 0 {
		seconds = time.Since(measureFrom).Seconds()
	}
	var all []time.Duration
	for _, own := range latencies {
		all = append(all, own...)
	}
	slices.Sort(all)
	n := counted.Load()
	out := map[string]any{
		"clients":        *clients,
		"seconds":        seconds,
		"calls":          n,
		"calls_per_s":    float64(n) / seconds,
		"p50_us":         percentile(all, 0.50),
		"p90_us":         percentile(all, 0.90),
		"p99_us":         percentile(all, 0.99),
		"errors":         errors.Load(),
		"answered":       answered.Load(),
		"bytes_per_call": 0.0,
	}
	if n > 0 {
		out["bytes_per_call"] = float64(bodySize.Load()) / float64(n)
	}
	json.NewEncoder(os.Stdout).Encode(out)
	if errors.Load() > 0 {
		os.Exit(1)
	}
}
