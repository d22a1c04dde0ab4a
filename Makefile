# vmshelf — see README.md. `make run` serves on the embedded default store;
# `make test` checks what the tests use (.ci/deps: installs what is
# missing, or stops saying how), then runs every test strictly: a tool still
# missing fails its test. `make test-short` runs the go tests without either,
# and lists what they skipped. CI runs `make test` through .ci/run.
GO      ?= go
BIN     := bin/vmshelf
DATA    ?= ./vmshelf-data
# Fuzz targets get a short run over their seed corpus in `make test`.
# Empty: each fuzz target gets an execution count (see fuzz below).
FUZZTIME ?=

.PHONY: build image run demo deps test test-short test-quick test-race test-race-kube test-kube test-boot guest-image fuzz bench lint lint-kube clean mutate mutate-all

# -buildvcs=auto: `vmshelf version` names the commit it was built from,
# even where the environment sets GOFLAGS=-buildvcs=false (this one does).
# internal/tools/buildprogress says what a first build does while it fetches
# modules and compiles (minutes on 2 cores, otherwise silent): a line every
# 10 s with the counts so far.
BUILDPROGRESS := $(GO) run ./internal/tools/buildprogress
build:
	$(BUILDPROGRESS) $(GO) build -v -buildvcs=auto -o $(BIN) ./cmd/vmshelf

# `make image`: vmshelf's container image with no container engine
# (internal/tools/ociimage): the static binary (CGO_ENABLED=0, stamped as build
# stamps it) on an empty base with the CA certificates, as user 65532,
# written as bin/vmshelf-image.tar, which docker load, podman load and
# k3s ctr images import take (docs/deploy/README.md). The Dockerfile builds
# the same with an engine.
image:
	$(GO) run ./internal/tools/ociimage/mkimage -go $(GO) -o bin/vmshelf-image.tar

run: build
	./$(BIN) serve --dev --data-dir $(DATA)

# `make demo`: a buyer's whole journey on this machine, for a newcomer at a
# browser (README's first screen): provisioner/kubetest's cmd/demo runs
# the API server with KubeVirt's virt-controller, the test node (libvirtd,
# QEMU in software emulation), the Stripe stand-in with its demo payment
# page and this build's bin/vmshelf serve --dev --vms-enable, and prints
# what to open and click. Root, and what `make deps` installs for the boot
# tests; the guest's first build takes minutes. Its logs go to
# bin/demo.log; Ctrl-C stops everything it started. At nice 10, as
# test-boot: libvirtd and its QEMUs inherit it.
demo: build
	cd provisioner/kubetest && nice -n 10 $(GO) build -o $(CURDIR)/bin/vmshelf-demo ./cmd/demo
	cd provisioner/kubetest && exec nice -n 10 $(CURDIR)/bin/vmshelf-demo -vmshelf $(CURDIR)/$(BIN) -log $(CURDIR)/bin/demo.log

# What the tests use that Go does not bring (Debian packages, npm packages,
# stripe-mock): installed when missing (as root or through sudo -n), or a
# stop at once naming each and the commands that install it.
# VMSHELF_INSTALL=0 never installs, only stops.
deps:
	@bash .ci/deps

# The tool check first, lint, then the race tests with provisioner/kubetest's
# build beside them at the lowest CPU priority (nice 19), then kubetest's
# tests (its binary's, then its test node's rules and the guest's recipe,
# without the boot tests: all three binaries from the one background build),
# then the fuzz step. The Kubernetes build is the longest single step
# of a cold run (7 of its minutes); at nice 19 it takes only the CPU the race
# tests leave idle (their waits on serve, Chromium and throttled uploads) and
# slows them hardly at all. (At the same priority, side by side, each slowed
# the other so much that the build took 17 minutes and the binary's tests
# ran past their timeout.) The build is the go command itself in the
# background (go -C, no subshell), so that a failed race run stops it, not
# only a shell around it. CI=true makes every test strict: a tool that is
# missing still fails its test instead of skipping.
test: export CI = true
test: deps
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory test-race-kube
	$(MAKE) --no-print-directory fuzz

KUBETEST_BINS := bin/kubetest
test-race-kube:
	@mkdir -p $(KUBETEST_BINS)
	@echo "nice -n 19 $(GO) -C provisioner/kubetest test -c -o $(KUBETEST_BINS)/ . ./testnode ./guestimage & (in the background)"
	@nice -n 19 $(GO) -C provisioner/kubetest test -c -o $(CURDIR)/$(KUBETEST_BINS)/ . ./testnode ./guestimage >bin/kubetest-build.log 2>&1 & kb=$$!; \
	$(MAKE) --no-print-directory test-race; rc=$$?; \
	if [ $$rc -ne 0 ]; then kill $$kb 2>/dev/null; wait $$kb; exit $$rc; fi; \
	wait $$kb; kbrc=$$?; cat bin/kubetest-build.log; \
	if [ $$kbrc -ne 0 ]; then echo "provisioner/kubetest: build failed"; exit $$kbrc; fi; \
	echo "cd provisioner/kubetest && ../../$(KUBETEST_BINS)/kubetest.test -test.count=1 -test.timeout $(KUBETEST_TIMEOUT)"; \
	start=$$(date +%s); cd provisioner/kubetest && \
	if $(CURDIR)/$(KUBETEST_BINS)/kubetest.test -test.count=1 -test.skip '$(BOOT_TESTS)' -test.timeout $(KUBETEST_TIMEOUT) >$(CURDIR)/bin/kubetest.log 2>&1; then \
		echo "ok  	provisioner/kubetest	$$(( $$(date +%s) - start ))s (the API server's log: bin/kubetest.log)"; \
	else cat $(CURDIR)/bin/kubetest.log; echo "FAIL	provisioner/kubetest"; exit 1; fi; \
	for p in testnode guestimage; do \
		if (cd $$p && $(CURDIR)/$(KUBETEST_BINS)/$$p.test -test.count=1 -test.skip '$(BOOT_TESTS)' -test.timeout $(KUBETEST_TIMEOUT)) >$(CURDIR)/bin/kubetest-$$p.log 2>&1; then \
			echo "ok  	provisioner/kubetest/$$p"; \
		else cat $(CURDIR)/bin/kubetest-$$p.log; echo "FAIL	provisioner/kubetest/$$p"; exit 1; fi; \
	done

# -vet=off: lint ran every vet analyzer on every package just before; the
# subset go test runs by itself would run again, under flags of its own,
# with its facts over every dependency (all of client-go, SQLite, Stripe).
# internal/tools/testprogress runs go test -json and prints a line per package as
# it finishes (go test itself holds one back until those listed before it
# are done), each skipped test as it skips, and at the end every failure's
# output and the counts. -timeout is a hang detector, not a budget: each
# test has deadlines of its own, and a loaded machine once took cmd/vmshelf
# past 12 minutes (5 to 9 on a quiet one).
GOTEST := $(GO) run ./internal/tools/testprogress $(GO) test -json
test-race:
	$(GOTEST) -race -vet=off -count=1 -timeout 25m ./...

# `make test-short`: test-race's tests with no tool check and not strict
# (CI=false), so a test whose tool is missing skips and says what installs
# it.
test-short:
	CI=false $(GOTEST) -race -count=1 -timeout 25m ./...

# `make test-quick`: the edit-test loop, under 3 minutes warm: every
# package's tests with -short (no race build, no test that starts vmshelf
# serve or a browser; provisioner/kubetest's API server is a module of its
# own and not in ./...), not strict.
test-quick:
	CI=false $(GOTEST) -short -count=1 -timeout 10m ./...

# The provisioner and docs/deploy against a real kube-apiserver and etcd run
# in-process (provisioner/kubetest, a module of its own so that
# k8s.io/kubernetes stays out of vmshelf's build). Not under -race: a race
# build of the API server doubles a cold build that is already the longest
# step of `make test` (see provisioner/kubetest/README.md); the provisioner's
# own tests run under -race above.
KUBETEST_TIMEOUT ?= 10m
test-kube:
	cd provisioner/kubetest && $(GO) test -count=1 -skip '$(BOOT_TESTS)' -timeout $(KUBETEST_TIMEOUT) ./...

# `make test-boot`: an order boots, through the binary (provisioner/kubetest's
# TestBoot, see its README): the guest built from Debian's packages
# (guestimage, cached outside the clone by package versions), KubeVirt's
# virt-controller, the test node with a real libvirtd and QEMU in software
# emulation. Root, libvirt, QEMU, OVMF, mmdebstrap and GRUB's tools (.ci/deps
# installs them). Minutes of emulated CPU: not in `make test`, whose budget
# it would break, but in CI's .ci/run, in a step of its own after it. The
# guest's build runs first and says whether the cache had it, then the
# edge's boot check is held to SeaBIOS's and OVMF's own verdicts on the
# guest's disks (guestimage); all of it at nice 10 (libvirtd, started by
# the test, and its QEMUs inherit it).
BOOT_TESTS = ^(TestBoot.*|TestEnsure)$$
BOOT_TIMEOUT ?= 50m
test-boot: export CI = true
test-boot: deps guest-image
	cd provisioner/kubetest && nice -n 10 $(GO) test -count=1 -timeout $(BOOT_TIMEOUT) -run '$(BOOT_TESTS)' -v ./guestimage
	cd provisioner/kubetest && nice -n 10 $(GO) test -count=1 -timeout $(BOOT_TIMEOUT) -run '$(BOOT_TESTS)' -v .

# `make guest-image`: the boot tests' guest, from the cache or built (about 7
# minutes cold on 2 cores, most of it Debian's mirror and dpkg); .ci/run
# builds it beside make test. It says whether the cache had it.
guest-image:
	cd provisioner/kubetest && nice -n 10 $(GO) test -count=1 -timeout $(BOOT_TIMEOUT) -run '^TestEnsure$$' -v ./guestimage

# Each fuzz target of the parsers that read hostile bytes, in turn (go test
# -fuzz takes one target at a time). `make fuzz FUZZTIME=10m` for a long run.
# By default each runs a count of inputs, about 10 s here, not a duration: Go
# 1.26's coordinator can report "context deadline exceeded" as a failure when a
# -fuzztime duration ends while a worker is busy (go.dev/issue/75804, fixed in
# Go 1.27); it failed CI once with no failing input. A count has no deadline.
# Minimising each new input gets 1 s: its default 60 s ate most of a 10 s run.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzInspector$$' -fuzztime $(or $(FUZZTIME),100000x) -fuzzminimizetime 1s ./qcow2
	$(GO) test -run '^$$' -fuzz '^FuzzStructure$$' -fuzztime $(or $(FUZZTIME),15000x) -fuzzminimizetime 1s ./qcow2
	$(GO) test -run '^$$' -fuzz '^FuzzStarts$$' -fuzztime $(or $(FUZZTIME),100000x) -fuzzminimizetime 1s ./internal/bootdisk

# `make bench`: vmshelf against dd, loopback, nginx and tusd on this machine (root; nginx, wrk,
# curl, qemu-img, tusd v2 needed; about 20 min, see bench/README.md), written to docs/bench.md and docs/bench.json.
# `make bench QUICK=1`: the same in under 3 minutes (256 MiB file, 1 repetition), for CI, written to
# bin/bench-quick.{md,json} so that it never replaces the full results; with -strict it is CI's smoke
# test: it fails on an error of the run (a bad answer, a subject that could not run, a failed check
# of the bench), never on a figure. More flags: BENCHFLAGS=... (see `go run ./bench -h` and
# bench/README.md).
bench:
	$(GO) run ./bench $(if $(QUICK),-quick -strict -md bin/bench-quick.md -json bin/bench-quick.json,-md docs/bench.md -json docs/bench.json) $(BENCHFLAGS)

# `make mutate`: plant bugs of .ci/mutations/ in a copy of the tree and
# check that the test named in each fails (see README "Tests"): CI's
# choice, every patch that guards a file changed since .ci/mutate-baseline
# and a rotating slice of the rest, in about 15 minutes; the others are
# checked to apply. `make mutate-all`: every patch (README "Planted bugs" has its time); on a
# clean tree where all are killed it rewrites .ci/mutate-baseline, to be
# committed. After the tool check and under CI=true, as `make test`: a
# mutation is killed by the assertion its test names, never survives by a
# skip.
mutate: export CI = true
mutate: deps
	bash .ci/mutate

mutate-all: export CI = true
mutate-all: deps
	bash .ci/mutate --all

# go vet with -race builds its packages as go test -race will, so the
# tests reuse them: a plain vet compiled all of client-go a second time
# (7 of a cold make test's minutes). The analyzers are the same.
#
# The race build of every package comes first, through buildprogress, so
# that a cold one says what it does; vet and the race tests then find its
# packages in the build cache.
lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$fmt" ]; then echo "not gofmt-formatted:"; echo "$$fmt"; exit 1; fi
	$(BUILDPROGRESS) $(GO) build -race -v ./...
	$(GO) vet -race ./...

# go vet of provisioner/kubetest with every analyzer (and their facts over
# all of Kubernetes) adds 2 min to a cold `make test`, which has no room
# for it; go test there runs vet's default analyzers on the package itself.
lint-kube:
	cd provisioner/kubetest && $(GO) vet ./...

clean:
	rm -rf bin
