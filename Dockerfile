# vmshelf's container image, for those who build with a container engine:
#
#   docker build -t localhost/vmshelf:latest \
#     --build-arg VERSION="$(git describe --tags --always --dirty)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(git log -1 --format=%cI)" .
#
# `make image` builds the same image with no container engine at all
# (internal/tools/ociimage, written as bin/vmshelf-image.tar), and there the
# labels' version and commit are read from the binary itself, so they say
# what `vmshelf version` says; here they say what the build arguments say.
# internal/tools/ociimage's TestDockerfile keeps this file in step with it: the
# same static build, files, user, environment, entrypoint, command, ports
# and label names.

ARG GO_VERSION=1.26

FROM docker.io/library/golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static (no C library in the image), stamped as make build stamps it.
RUN CGO_ENABLED=0 GOOS=linux go build -buildvcs=auto -trimpath -o /out/usr/local/bin/vmshelf ./cmd/vmshelf
# The files beside the binary, as internal/tools/ociimage writes them: the CA
# bundle (Stripe, S3 and the Kubernetes API are reached over TLS), the user
# vmshelf (65532) so that tools show a name, /data (the volume's mount
# point) the user's, and /tmp.
RUN mkdir -p /out/etc/ssl/certs /out/data /out/tmp \
 && cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nvmshelf:x:65532:65532:vmshelf:/data:/sbin/nologin\n' >/out/etc/passwd \
 && printf 'root:x:0:\nvmshelf:x:65532:\n' >/out/etc/group \
 && chmod 0700 /out/data && chmod 1777 /out/tmp

FROM scratch
COPY --from=build /out/usr/local/bin/vmshelf /usr/local/bin/vmshelf
COPY --from=build /out/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/etc/passwd /etc/passwd
COPY --from=build /out/etc/group /etc/group
COPY --from=build --chown=65532:65532 /out/data /data
COPY --from=build /out/tmp /tmp
ARG VERSION="(devel)"
ARG REVISION=""
ARG CREATED="1970-01-01T00:00:00Z"
ARG SOURCE="https://github.com/vmshelf/vmshelf"
LABEL org.opencontainers.image.title="vmshelf" \
      org.opencontainers.image.description="QCOW2 image gateway and VM market edge" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.created="${CREATED}"
# Every command run in the container (serve, and the tenant commands run
# through kubectl exec) uses the store on the volume.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VMSHELF_DATA_DIR=/data/vmshelf
USER 65532:65532
WORKDIR /
EXPOSE 8480/tcp 8481/tcp
ENTRYPOINT ["/usr/local/bin/vmshelf"]
CMD ["serve", "--data-addr=0.0.0.0:8480", "--control-addr=0.0.0.0:8481"]
