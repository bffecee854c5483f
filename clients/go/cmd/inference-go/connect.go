package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// dial opens a channel: plaintext, or TLS with -ca's CA (the system's roots without it).
// It does not wait for the server: the first call's deadline covers connecting.
func dial(o options) (*grpc.ClientConn, error) {
	if !o.tls && o.ca == "" {
		// WithInsecure, not credentials/insecure: the latter is newer than Debian's grpc.
		return grpc.Dial(o.target, grpc.WithInsecure())
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.ca != "" {
		pem, err := os.ReadFile(o.ca)
		if err != nil {
			return nil, err
		}
		config.RootCAs = x509.NewCertPool()
		if !config.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", o.ca)
		}
	}
	return grpc.Dial(o.target, grpc.WithTransportCredentials(credentials.NewTLS(config)))
}
