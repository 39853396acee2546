// probeclient measures CSI Probe latency the way the Kubernetes sidecars see it: from a Go gRPC client.
// Usage: probeclient -endpoint unix:///path/csi.sock -calls 5000 -concurrency 1
// Prints one JSON object: per-call latency percentiles (ms) and calls per second.
//
// probeclient -serve /path/floor.sock instead serves, from grpc-go, an Identity service whose Probe does
// nothing and a Controller service whose CreateVolume answers a Volume of the driver's shape (a
// 35-character id, the capacity asked for, one topology segment) and whose DeleteVolume answers empty:
// the transport's floor on this machine, which the driver's figures are read against.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func percentile(sorted []time.Duration, q float64) float64 {
	i := int(q / 100 * float64(len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}

type emptyIdentity struct {
	csi.UnimplementedIdentityServer
}

func (emptyIdentity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

type emptyController struct {
	csi.UnimplementedControllerServer
}

func (emptyController) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      "lv-" + hex.EncodeToString(id),
		CapacityBytes: req.GetCapacityRange().GetRequiredBytes(),
		AccessibleTopology: []*csi.Topology{
			{Segments: map[string]string{"topology.local.csi.ballast.dev/zone": "local"}},
		},
	}}, nil
}

func (emptyController) DeleteVolume(context.Context, *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	return &csi.DeleteVolumeResponse{}, nil
}

func serve(path string) {
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	csi.RegisterIdentityServer(server, emptyIdentity{})
	csi.RegisterControllerServer(server, emptyController{})
	if err := server.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	endpoint := flag.String("endpoint", "", "unix:///path/to/csi.sock")
	calls := flag.Int("calls", 5000, "total Probe calls")
	concurrency := flag.Int("concurrency", 1, "parallel callers, one connection each")
	servePath := flag.String("serve", "", "serve an empty Identity service on this socket path and exit on SIGTERM")
	flag.Parse()
	if *servePath != "" {
		serve(*servePath)
		return
	}
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "-endpoint is required")
		os.Exit(2)
	}
	perWorker := *calls / *concurrency
	samples := make([][]time.Duration, *concurrency)
	var wg sync.WaitGroup
	conns := make([]*grpc.ClientConn, *concurrency)
	for i := range conns {
		conn, err := grpc.Dial(*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		conns[i] = conn
		if _, err := csi.NewIdentityClient(conn).Probe(context.Background(), &csi.ProbeRequest{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	start := time.Now()
	for w := 0; w < *concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			client := csi.NewIdentityClient(conns[w])
			out := make([]time.Duration, 0, perWorker)
			for i := 0; i < perWorker; i++ {
				t := time.Now()
				if _, err := client.Probe(context.Background(), &csi.ProbeRequest{}); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				out = append(out, time.Since(t))
			}
			samples[w] = out
		}(w)
	}
	wg.Wait()
	wall := time.Since(start)
	var all []time.Duration
	for _, s := range samples {
		all = append(all, s...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"n":                len(all),
		"p50_ms":           percentile(all, 50),
		"p99_ms":           percentile(all, 99),
		"min_ms":           percentile(all, 0),
		"calls_per_second": float64(len(all)) / wall.Seconds(),
	})
}
