# vmshelf — see README.md. `make run` serves on the embedded default store;
# `make test` runs every test (CI runs the same through .ci/run).
GO      ?= go
BIN     := bin/vmshelf
DATA    ?= ./vmshelf-data
# Fuzz targets get a short run over their seed corpus in `make test`.
FUZZTIME ?= 10s

.PHONY: build run test test-unit fuzz bench lint clean

build:
	$(GO) build -o $(BIN) ./cmd/vmshelf

run: build
	./$(BIN) serve --dev --data-dir $(DATA)

test: lint
	$(GO) test -race -count=1 -timeout 9m ./...
	$(MAKE) --no-print-directory fuzz

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzInspector$$' -fuzztime $(FUZZTIME) ./imagestore/qcow2

bench: build
	@echo "benchmarks arrive with issue 5 (bench/)"; exit 1

lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$fmt" ]; then echo "not gofmt-formatted:"; echo "$$fmt"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin
