package postgres_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vmshelf/vmshelf/imagestore"
	"github.com/vmshelf/vmshelf/imagestore/postgres"
)

// Two processes on one database, as two replicas are: the test binary
// starts copies of itself (TestMain runs child instead of the tests when
// childEnv is set), lets each open the store and say it is ready, then
// releases them together through their stdin and reads what each won.

const (
	childEnv = "VMSHELF_PGTEST_CHILD" // the child's job
	urlEnv   = "VMSHELF_PGTEST_URL"
	argEnv   = "VMSHELF_PGTEST_ARG"
)

// outcome is a child's answer: the keys it won, and how many of its
// attempts were refused for the reason the race expects.
type outcome struct {
	Won     []string `json:"won"`
	Refused int      `json:"refused"`
	Errors  []string `json:"errors"`
}

// workers is how many goroutines each child races with, so that the
// race is between processes and within them.
const workers = 4

func child() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := postgres.Open(ctx, os.Getenv(urlEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, "no start signal:", err)
		return 1
	}
	var (
		mu  sync.Mutex
		out outcome
	)
	record := func(key string, err error, expected error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			out.Won = append(out.Won, key)
		case expected != nil && errors.Is(err, expected):
			out.Refused++
		default:
			out.Errors = append(out.Errors, err.Error())
		}
	}
	arg := os.Getenv(argEnv)
	n, _ := strconv.Atoi(arg)
	var wg sync.WaitGroup
	switch job := os.Getenv(childEnv); job {
	case "migrate":
		// Open above was the job.
	case "consume":
		// Every child tries every ticket, each worker its share.
		for w := range workers {
			wg.Go(func() {
				for i := w; i < n; i += workers {
					key := fmt.Sprintf("ticket-%d", i)
					_, err := s.ConsumeTicket(ctx, imagestore.HashSecret(key), time.Now())
					record(key, err, imagestore.ErrTicketUsed)
				}
			})
		}
	case "tickets":
		// Ticket after ticket for one tenant until the quota refuses.
		tn, err := s.Tenant(ctx, "quota")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		pid := os.Getpid()
		for w := range workers {
			wg.Go(func() {
				for i := range n {
					key := fmt.Sprintf("%d-%d-%d", pid, w, i)
					tk := imagestore.Ticket{UploadID: imagestore.NewUploadID(), TenantID: tn.ID, Name: key, ExpiresAt: time.Now().Add(time.Hour)}
					err := s.CreateTicket(ctx, tk, imagestore.HashSecret(key), quota)
					record(key, err, imagestore.ErrQuota)
				}
			})
		}
	case "orders":
		l, err := s.Listing(ctx, arg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		buyer, err := s.Tenant(ctx, "buyer")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for range workers {
			wg.Go(func() {
				for range ordersPerWorker {
					o := orderOn(l, buyer)
					record(o.ID, s.CreateOrder(ctx, o, "", 0), imagestore.ErrNoCapacity)
				}
			})
		}
	case "lease":
		// n rounds on one lease, every worker of every process in each:
		// round r asks at leaseBase + r*leaseTTL, when the lease of round
		// r-1 has just expired, so the rounds need no clock in common.
		pid := os.Getpid()
		for w := range workers {
			wg.Go(func() {
				holder := fmt.Sprintf("replica-%d-%d", pid, w)
				for r := range n {
					now := leaseBase.Add(time.Duration(r) * leaseTTL)
					l, err := s.AcquireLease(ctx, "leader", holder, leaseTTL, now)
					record(fmt.Sprintf("%d:%d", r, l.Token), err, imagestore.ErrLeaseHeld)
				}
			})
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown child job", job)
		return 1
	}
	wg.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		return 1
	}
	return 0
}

// The "lease" race's clock: the rounds' now values, far from the real
// clock so that a store consulting it is caught.
var leaseBase = time.Date(2031, 3, 4, 5, 6, 7, 123456789, time.UTC)

const leaseTTL = 15 * time.Second

const (
	quota           = 10 // the "tickets" race's quota
	ordersPerWorker = 5
	hostAccount     = "acct_host"
)

func orderOn(l imagestore.Listing, buyer imagestore.Tenant) imagestore.Order {
	return imagestore.Order{
		ID: imagestore.NewOrderID(), ListingID: l.ID, BuyerID: buyer.ID, HostID: l.HostID,
		Quantity: 1, ImageKind: imagestore.ImageCatalogue, Image: "debian-12", Name: "vm",
		UnitPrice: l.UnitPrice, Total: l.UnitPrice, Currency: l.Currency, Destination: hostAccount,
		ReserveUntil: time.Now().Add(time.Hour),
	}
}

// race runs procs children of job on the database at url, releases them
// together and returns their outcomes.
func race(t *testing.T, url, job, arg string, procs int) []outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	type proc struct {
		cmd   *exec.Cmd
		start io.WriteCloser
		out   *bufio.Reader
	}
	var ps []proc
	for range procs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+job, urlEnv+"="+url, argEnv+"="+arg)
		cmd.Stderr = &testWriter{t: t}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, proc{cmd: cmd, start: stdin, out: bufio.NewReader(stdout)})
	}
	for i, p := range ps {
		if line, err := p.out.ReadString('\n'); err != nil || line != "ready\n" {
			t.Fatalf("child %d: %q, %v; want ready", i, line, err)
		}
	}
	for _, p := range ps {
		_, _ = io.WriteString(p.start, "go\n")
	}
	outs := make([]outcome, procs)
	for i, p := range ps {
		if err := json.NewDecoder(p.out).Decode(&outs[i]); err != nil {
			t.Fatalf("child %d: its outcome: %v", i, err)
		}
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		for _, e := range outs[i].Errors {
			t.Errorf("child %d: unexpected error: %s", i, e)
		}
	}
	return outs
}

// testWriter passes a child's stderr to the test log.
type testWriter struct{ t *testing.T }

func (w *testWriter) Write(b []byte) (int, error) {
	w.t.Logf("child: %s", b)
	return len(b), nil
}
