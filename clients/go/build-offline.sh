#!/bin/sh
# Builds cmd/inference-go without a module proxy, from Debian's Go packages
# (README.md): GOPATH mode, this module linked into a temporary GOPATH under its import
# path, the packages' sources in /usr/share/gocode. Usage: build-offline.sh [OUTPUT]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/inference-go}
module=github.com/inference-service/inference-service/clients/go
gocode=/usr/share/gocode/src
# grpc's codec calls github.com/golang/protobuf: its v1.3 (Debian's -1-3-dev, which
# golang-google-grpc-dev may pull in) cannot read the generated (APIv2) messages and
# panics at the first reply; v1.4 and later wrap APIv2.
if ! grep -qs ProtoPackageIsVersion4 "$gocode/github.com/golang/protobuf/proto/proto.go"; then
	echo "$gocode/github.com/golang/protobuf is missing or older than v1.4:" \
		"apt-get install golang-github-golang-protobuf-1-5-dev (README.md)" >&2
	exit 1
fi
gopath=$(mktemp -d)
trap 'rm -rf "$gopath"' EXIT
mkdir -p "$gopath/src/$(dirname "$module")"
ln -s "$here" "$gopath/src/$module"
cd "$gopath/src/$module"
GO111MODULE=off GOPATH="$gopath:${gocode%/src}" \
	GOFLAGS= go build -o "$out" "$module/cmd/inference-go"
