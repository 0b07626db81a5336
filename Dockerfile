# syntax=docker/dockerfile:1
# The kvwarden node image: the node binary, static (CGO_ENABLED=0: no NVML,
# devices come from configuration), and envexec for the Kubernetes preStop
# hook (deploy/envexec), on distroless with no shell, as a non-root user.
#   docker build -t kvwarden:dev .
# deploy/README.md has the rest; deploy/kubernetes's tests check the
# manifests against this file (entrypoint, binaries, user).

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags="-s -w" -o /out/node ./cmd/node && \
    cd deploy && go build -ldflags="-s -w" -o /out/envexec ./envexec

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/node /node
COPY --from=build /out/envexec /envexec
USER 65532:65532
ENTRYPOINT ["/node"]
