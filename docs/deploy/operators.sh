#!/bin/sh
# KubeVirt's and CDI's operators, from their release manifests at the
# versions the kit is made for, applied only once every byte is the one
# pinned in releases.sha256 (beside this script). Run it before
# kubectl apply -k docs/deploy/overlays/market, whose KubeVirt and CDI CRs
# need the CRDs these install:
#
#   docs/deploy/operators.sh
#
# Needs curl, sha256sum and kubectl (with the cluster's kubeconfig). A
# download that differs from its pin stops the script before kubectl runs:
# a release manifest runs operators with rights over the whole cluster.
# The manifests go to a temporary directory, removed at the end.
set -eu

kubevirt_version=v1.9.0
cdi_version=v1.66.1

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 1' HUP INT TERM

# https only, also after GitHub's redirect to its download host; a failed
# download is an error, not an error page saved as the manifest.
download() {
	curl --fail --silent --show-error --location --proto '=https' --max-time 300 \
		--output "$work/$1" "$2"
}

download kubevirt-operator.yaml \
	"https://github.com/kubevirt/kubevirt/releases/download/$kubevirt_version/kubevirt-operator.yaml"
download cdi-operator.yaml \
	"https://github.com/kubevirt/containerized-data-importer/releases/download/$cdi_version/cdi-operator.yaml"

(cd "$work" && sha256sum --check --strict "$here/releases.sha256")

# Server-side: kubectl's client-side apply keeps a copy of each object in
# an annotation, and a Kubernetes object's annotations hold 256 KiB in
# all; KubeVirt's own CRD of its CR (kubevirts.kubevirt.io) is already
# 233 KiB of JSON in v1.8.0. Server-side apply keeps no such copy.
kubectl apply --server-side -f "$work/kubevirt-operator.yaml" -f "$work/cdi-operator.yaml"
kubectl wait --for condition=Established --timeout 5m \
	crd/kubevirts.kubevirt.io crd/cdis.cdi.kubevirt.io
