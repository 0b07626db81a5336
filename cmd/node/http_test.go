package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/httpapi"
	"github.com/kvwarden/kvwarden/internal/testwait"
)

// upBaseURL is the line where node up says where its API is.
var upBaseURL = regexp.MustCompile(`^OpenAI base URL: (http://\S+/v1) \(API key (\S+), tenant (\S+)\)`)

// upCluster is a node up process that has printed its cluster.
type upCluster struct {
	*process
	baseURL, key, logDir string
	nodes                map[string]upNode // by node name, as up's table gave them
	printed              []string          // up's lines up to its table's last
}

// startUp runs node up with args and reads what it prints up to its last
// line.
func startUp(t *testing.T, args ...string) *upCluster {
	t.Helper()
	c := &upCluster{logDir: t.TempDir(), nodes: map[string]upNode{}}
	c.process = startProcess(t, append([]string{"up", "--listen", freeTCPAddr(t), "--gossip-base-port",
		strconv.Itoa(freeGossipPort(t)), "--log-dir", c.logDir}, args...)...)
	t.Cleanup(func() {
		// Stopped by a signal, up removes the credentials it made for its
		// router's address; killed, it would leave them for whichever
		// later node takes that port, and status would find the wrong CA.
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		for _, n := range c.nodes {
			_ = syscall.Kill(n.pid, syscall.SIGCONT)
		}
		select {
		case <-c.exited:
		case <-time.After(2 * exitTimeout):
			t.Errorf("up did not exit within %s of SIGTERM", 2*exitTimeout)
		}
		for _, n := range c.nodes {
			_ = syscall.Kill(n.pid, syscall.SIGKILL)
		}
	})
	c.printed = upPrinted(t, c.process, func(line string) {
		parseUpRow(line, c.nodes)
		if m := upBaseURL.FindStringSubmatch(line); m != nil {
			c.baseURL, c.key = m[1], m[2]
		}
	})
	return c
}

// stop sends up SIGTERM and checks that it exits 0 and that every node of
// its table (restarted ones as they were last printed) has exited with it.
func (c *upCluster) stop(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := c.exitCode(t, 2*exitTimeout); code != exitOK {
		t.Fatalf("up: exit %d after SIGTERM, want 0; stderr:\n%s", code, c.stderr)
	}
	for name, n := range c.nodes {
		if err := syscall.Kill(n.pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s, pid %d, still exists after up exited (kill 0: %v)", name, n.pid, err)
		}
	}
}

// TestBinaryUpHTTP: the OpenAI SDK and plain HTTP talk to node up's router
// with the example key: the reference answer, whole and streamed; answers
// cut at a stop sequence are counted by the router as completed, none as
// cancelled; a key added with node keys new is accepted once the router has
// SIGHUP; a decode node lost mid-stream ends the stream with a node_lost
// error event, and no [DONE]; with no decode node left, a request is 503
// unavailable without Retry-After, as /readyz says.
func TestBinaryUpHTTP(t *testing.T) {
	// A short --lost-after: the decode node stopped below is taken for
	// lost soon after membership declares it dead.
	up := startUp(t, "--http", "127.0.0.1:0", "--", "--reclaim-after", "2s", "--lost-after", "1s")
	if up.baseURL == "" || up.key != exampleAPIKey {
		t.Fatalf("up printed base URL %q and key %q, want the example key %q", up.baseURL, up.key, exampleAPIKey)
	}
	c := openai.NewClient(option.WithBaseURL(up.baseURL+"/"), option.WithAPIKey(up.key), option.WithMaxRetries(0))
	ctx := context.Background()
	const prompt, max = "Hello, kvwarden", 24
	want, n := referenceText(t, actors.DefaultConfig(), prompt, max)
	params := openai.CompletionNewParams{Model: "builtin", MaxTokens: openai.Int(max),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}}
	res, err := c.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].Text != want || res.Usage.CompletionTokens != int64(n) {
		t.Fatalf("the router answered %q (%d tokens), the reference %q (%d)", res.Choices[0].Text, res.Usage.CompletionTokens, want, n)
	}

	// Plain HTTP, as curl sends it: the stream's last event is [DONE].
	req, _ := http.NewRequest(http.MethodPost, up.baseURL+"/chat/completions",
		strings.NewReader(`{"model":"builtin","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+up.key)
	raw, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	sc := bufio.NewScanner(raw.Body)
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			events = append(events, line)
		}
	}
	raw.Body.Close()
	if raw.StatusCode != 200 || len(events) < 2 || events[len(events)-1] != "data: [DONE]" ||
		!strings.Contains(events[0], `"role":"assistant"`) {
		t.Fatalf("a streamed chat over plain HTTP: %d, events %q", raw.StatusCode, events)
	}

	// A stop sequence from the reference's first characters, whole and
	// streamed: the text before it, finish stop, and the requests
	// counted as completed.
	stop, cut := earlyStop(t, want)
	params.Stop = openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)}
	params.MaxTokens = openai.Int(1024)
	if res, err := c.Completions.New(ctx, params); err != nil || res.Choices[0].Text != cut || res.Choices[0].FinishReason != "stop" {
		t.Fatalf("a completion with stop %q: %+v, %v; want %q, finish stop", stop, res, err, cut)
	}
	stream := c.Completions.NewStreaming(ctx, params)
	var text strings.Builder
	for stream.Next() {
		text.WriteString(stream.Current().Choices[0].Text)
	}
	if err := stream.Err(); err != nil || text.String() != cut {
		t.Fatalf("a streamed completion with stop %q: %q, %v; want %q", stop, text.String(), err, cut)
	}
	root := strings.TrimSuffix(up.baseURL, "/v1")
	for series, want := range map[string]float64{`kvwarden_requests_finished_total{outcome="completed"}`: 4,
		`kvwarden_requests_failed_total{code="cancelled"}`: 0} {
		if got := scraped(t, root, series); got != want {
			t.Errorf("the router's %s is %g after 4 requests, 2 stopped; want %g", series, got, want)
		}
	}
	params.Stop = openai.CompletionNewParamsStopUnion{}

	// A key made with node keys new works once the router reads its keys
	// file again.
	code, key, stderr := runBinary(t, "", "keys", "new", "--file", filepath.Join(up.logDir, "api-keys.json"), "--tenant", "newco")
	if code != exitOK {
		t.Fatalf("keys new: exit %d: %s", code, stderr)
	}
	key = strings.TrimSpace(key)
	modelsWith := func(key string) int {
		req, _ := http.NewRequest(http.MethodGet, up.baseURL+"/models", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := modelsWith(key); got != http.StatusUnauthorized {
		t.Fatalf("a new key before SIGHUP: %d", got)
	}
	if err := syscall.Kill(up.nodes["router-0"].pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the router accepts the new key", time.Minute, func() bool { return modelsWith(key) == 200 })

	// The decode node frozen (SIGSTOP) after the stream's first token,
	// until membership declares it dead and --lost-after passes: the
	// router tells the client the node was lost. (Killed outright, it
	// would make up stop the whole cluster, the router with it.)
	stream = c.Completions.NewStreaming(ctx, params)
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	if err := syscall.Kill(up.nodes["decode-0"].pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	chunks := 1
	for stream.Next() {
		chunks++
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), `"code":"node_lost"`) {
		t.Fatalf("after %d chunks the stream of a killed decode node ended with %v, want a node_lost error event", chunks, err)
	}

	// The only decode node gone: 503 unavailable naming it, no
	// Retry-After, as /readyz says.
	resp, err := http.Get(root + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(ready), "no decode node") {
		t.Errorf("/readyz with the decode node lost: %d %q", resp.StatusCode, ready)
	}
	var apiErr *openai.Error
	_, err = c.Completions.New(ctx, params)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Code != "unavailable" ||
		apiErr.Response.Header.Get("Retry-After") != "" || !strings.HasPrefix(apiErr.Message, "no decode node is in sight") {
		t.Fatalf("a request with the decode node lost: %v, want 503 unavailable naming decode, no Retry-After", err)
	}
}

// earlyStop is a stop sequence that first appears within the first
// characters of text, two whole characters from the fifth on, and text cut
// before it.
func earlyStop(t *testing.T, text string) (stop, cut string) {
	t.Helper()
	runes := []rune(text)
	for i := 4; i+2 <= len(runes); i++ {
		stop = string(runes[i : i+2])
		if at := strings.Index(text, stop); !strings.ContainsRune(stop, utf8.RuneError) && at == len(string(runes[:i])) {
			return stop, text[:at]
		}
	}
	t.Fatalf("no stop sequence early in %q", text)
	return "", ""
}

// scraped is the value of series in the /metrics of the node serving HTTP
// at root.
func scraped(t *testing.T, root, series string) float64 {
	t.Helper()
	res, err := http.Get(root + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", series)
	return 0
}

// TestUpExampleKeyLoopbackOnly: node up serves its API with the example
// key only on loopback; anywhere else it wants a key of the user's own.
func TestUpExampleKeyLoopbackOnly(t *testing.T) {
	for _, tc := range []struct {
		http, key string
		ok        bool
	}{
		{"127.0.0.1:8000", exampleAPIKey, true},
		{"[::1]:8000", exampleAPIKey, true},
		{"localhost:8000", exampleAPIKey, true},
		{":8000", exampleAPIKey, false},
		{"0.0.0.0:8000", exampleAPIKey, false},
		{"192.0.2.1:8000", exampleAPIKey, false},
		{"0.0.0.0:8000", "kvw-a-key-of-my-own", true},
	} {
		o := upOptions{Prefill: 1, Decode: 1, Listen: defaultEndpoint, ReadyTimeout: time.Second, StopTimeout: time.Second,
			HTTP: tc.http, APIKey: tc.key}
		if err := o.check(); (err == nil) != tc.ok {
			t.Errorf("--http %s --api-key %s: %v, want ok %v", tc.http, tc.key, err, tc.ok)
		}
	}
}

// TestBinaryHTTPS: with --http-tls-cert and --http-tls-key the API is
// served over TLS only; one of the two alone is a usage error.
func TestBinaryHTTPS(t *testing.T) {
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	certFile, keyFile, keysFile := filepath.Join(dir, "http.crt"), filepath.Join(dir, "http.key"), filepath.Join(dir, "keys.json")
	for path, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := httpapi.AddKey(keysFile, httpapi.KeyEntry{Name: "acme", Tenant: "acme", SHA256: httpapi.HashKey("kvw-tls")}); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runBinary(t, "", "run", "--role", "all", "--insecure", "--http", "127.0.0.1:0",
		"--http-tls-cert", certFile); code != exitUsage || !strings.Contains(stderr, "give both") {
		t.Fatalf("--http-tls-cert alone: exit %d: %s", code, stderr)
	}
	addr := freeTCPAddr(t)
	startNode(t, "--role", "all", "--insecure", "--gossip", "127.0.0.1:0", "--http", addr, "--http-tls-cert", certFile,
		"--http-tls-key", keyFile, "--api-keys", keysFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer kvw-tls")
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.TLS == nil {
		t.Fatalf("/v1/models over TLS: %d (TLS %v)", res.StatusCode, res.TLS != nil)
	}
	plain, err := http.Get("http://" + addr + "/healthz")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == 200 {
			t.Fatal("plain HTTP answered 200 on the HTTPS port")
		}
	}
}

// selfSigned is a certificate for 127.0.0.1 signed by its own key, and
// the key, in PEM.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Minute),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}
