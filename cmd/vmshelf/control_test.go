package main

import (
	"errors"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/internal/cli"
	"github.com/vmshelf/vmshelf/internal/clientaddr"
)

// TestServeFlagsLimits: the new serve flags' defaults, values and
// refusals (each a usage error naming the flag).
func TestServeFlagsLimits(t *testing.T) {
	f, err := parseServeFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.controlMaxConns != 512 || f.controlIdleTimeout != 60*time.Second || f.controlHeaderTimeout != 10*time.Second ||
		f.logLevel != slog.LevelInfo || f.trustedProxies.Proxies != nil || f.trustedProxies.Header != clientaddr.XForwardedFor || f.fetchQueueWait != 30*time.Second {
		t.Errorf("defaults: max-conns %d, idle %v, header %v, log %v, proxies %v, queue wait %v",
			f.controlMaxConns, f.controlIdleTimeout, f.controlHeaderTimeout, f.logLevel, f.trustedProxies, f.fetchQueueWait)
	}

	f, err = parseServeFlags([]string{"--trusted-proxies", " 10.1.2.3/8, 192.168.1.7,::1,fd00::/8,", "--forwarded-header", "forwarded", "--fetch-queue-wait", "2s",
		"--log-level", "WARN", "--control-max-conns", "7", "--control-idle-timeout", "2s", "--control-header-timeout", "30s"})
	if err != nil {
		t.Fatal(err)
	}
	want := clientaddr.Proxies{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32"),
		netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("fd00::/8")}
	if !reflect.DeepEqual(f.trustedProxies, clientaddr.Trust{Proxies: want, Header: clientaddr.Forwarded}) {
		t.Errorf("trusted proxies %v, want %v and Forwarded", f.trustedProxies, want)
	}
	if f.fetchQueueWait != 2*time.Second || f.logLevel != slog.LevelWarn || f.controlMaxConns != 7 ||
		f.controlIdleTimeout != 2*time.Second || f.controlHeaderTimeout != 30*time.Second {
		t.Errorf("set: queue wait %v, log %v, max-conns %d, idle %v, header %v",
			f.fetchQueueWait, f.logLevel, f.controlMaxConns, f.controlIdleTimeout, f.controlHeaderTimeout)
	}
	for _, lv := range []struct {
		name string
		want slog.Level
	}{{"debug", slog.LevelDebug}, {"info", slog.LevelInfo}, {"warn", slog.LevelWarn}, {"error", slog.LevelError}} {
		f, err := parseServeFlags([]string{"--log-level", lv.name})
		if err != nil || f.logLevel != lv.want {
			t.Errorf("--log-level %s: %v, %v", lv.name, f, err)
		}
	}

	t.Setenv("VMSHELF_LOG_LEVEL", "error")
	t.Setenv("VMSHELF_TRUSTED_PROXIES", "127.0.0.1")
	t.Setenv("VMSHELF_FETCH_QUEUE_WAIT", "5s")
	f, err = parseServeFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.logLevel != slog.LevelError || len(f.trustedProxies.Proxies) != 1 || f.trustedProxies.Proxies[0] != netip.MustParsePrefix("127.0.0.1/32") ||
		f.fetchQueueWait != 5*time.Second {
		t.Errorf("from env: log %v, proxies %v, queue wait %v", f.logLevel, f.trustedProxies, f.fetchQueueWait)
	}
}

// TestServeFlagsLimitsRefused: bad values of the new flags are usage
// errors (exit 2) naming the flag.
func TestServeFlagsLimitsRefused(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--log-level", "verbose"}, "log-level"},
		{[]string{"--log-level", "info+2"}, "log-level"},
		{[]string{"--log-level", ""}, "log-level"},
		{[]string{"--trusted-proxies", "10.0.0.0/33"}, "trusted-proxies"},
		{[]string{"--trusted-proxies", "10.0.0.0/8,proxy.example"}, "proxy.example"},
		{[]string{"--trusted-proxies", "fe80::1%eth0"}, "trusted-proxies"},
		{[]string{"--trusted-proxies", "0.0.0.0/0"}, "trusted-proxies"},
		{[]string{"--trusted-proxies", "10.0.0.0/8,::/0"}, "::/0"},
		{[]string{"--trusted-proxies", "128.0.0.0/1"}, "trusted-proxies"},
		{[]string{"--forwarded-header", "X-Real-Ip"}, "forwarded-header"},
		{[]string{"--forwarded-header", "X-Forwarded-For,Forwarded"}, "forwarded-header"},
		{[]string{"--forwarded-header", ""}, "forwarded-header"},
		{[]string{"--fetch-queue-wait", "-1s"}, "fetch-queue-wait"},
		{[]string{"--fetch-queue-wait", "0"}, "fetch-queue-wait"},
		{[]string{"--fetch-queue-wait", "soon"}, "fetch-queue-wait"},
		{[]string{"--store-timeout", "0"}, "store-timeout"},
		{[]string{"--store-timeout", "31s"}, "store-timeout"},
		{[]string{"--control-max-conns", "0"}, "control-max-conns"},
		{[]string{"--control-idle-timeout", "0s"}, "control-idle-timeout"},
		{[]string{"--control-header-timeout", "0s"}, "control-header-timeout"},
		{[]string{"--control-header-timeout", "31s"}, "control-header-timeout"},
	} {
		_, err := parseServeFlags(tc.args)
		var ue cli.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: %v, want a usage error", tc.args, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.mention) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %q, want one line mentioning %q", tc.args, err, tc.mention)
		}
	}
}
