package testenv

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// startEtcd starts a one-member etcd on loopback ports picked by the kernel.
// Ports are found by binding :0 and closing again, so another process can
// grab one in between; the caller retries a few times when that happens.
func startEtcd(dir, host string) (*embed.Etcd, string, error) {
	clientPort, err := freePort(host)
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort(host)
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort(host, fmt.Sprint(clientPort))}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort(host, fmt.Sprint(peerPort))}

	cfg := embed.NewConfig()
	cfg.Name = "kube-testenv"
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	// The data lives only as long as the test run; fsync only makes every
	// write slower on a busy test machine.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("etcd failed before it was ready: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", fmt.Errorf("etcd not ready after 60s")
	}
	return e, clientURL.String(), nil
}

func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
