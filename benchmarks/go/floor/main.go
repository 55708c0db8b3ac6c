// The floor of benchmarks/proxy_overhead.py's throughput mode: a plain reverse-proxy hop that measures nothing.
// The standard library's httputil.ReverseProxy in front of one upstream, every response flushed as it comes
// (FlushInterval -1, so SSE streams through), upstream connections kept alive in a pool as large as the
// measuring proxy's.
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "HOST:PORT to listen on")
	upstream := flag.String("upstream", "", "the upstream's origin, e.g. http://127.0.0.1:8000")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		log.Fatalf("-upstream: expected an http:// URL, got %q", *upstream)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	proxy.Transport = &http.Transport{
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true, // bytes as they come, as the measuring proxy relays them
	}
	log.Fatal(http.ListenAndServe(*listen, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The upstream may answer as soon as it has read the body, before the transport has seen the request
		// body's end; an HTTP/1 handler's request body is closed once its response starts, which would fail
		// that request's write and close the upstream connection mid-answer (a rare "unexpected EOF").
		http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	})))
}
