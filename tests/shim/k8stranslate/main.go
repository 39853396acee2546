// Command k8s-translate runs Kubernetes' own csi-translation-lib on JSON requests, one per stdin line,
// and answers each with one JSON line on stdout. Ballast's differential test compares the shim with it.
//
// Request:  {"op": "<op>", "object": <PV|Volume|StorageClass|null>, "podNamespace": "...",
//
//	"inTreePluginName": "...", "driverName": "...", "volumeHandle": "...", "nodeID": "...",
//	"name": "...", "pv": <PV|null>, "volume": <Volume|null>}
//
// Response: {"result": <value>} | {"error": "<text>"} | {"error": "<text>", "panic": true}
//
//	| {"decodeError": "<text>"} when the input is not a valid Kubernetes object.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	storage "k8s.io/api/storage/v1"
	csitranslation "k8s.io/csi-translation-lib"
)

type request struct {
	Op               string          `json:"op"`
	Object           json.RawMessage `json:"object"`
	PodNamespace     string          `json:"podNamespace"`
	InTreePluginName string          `json:"inTreePluginName"`
	DriverName       string          `json:"driverName"`
	VolumeHandle     string          `json:"volumeHandle"`
	NodeID           string          `json:"nodeID"`
	Name             string          `json:"name"`
	PV               json.RawMessage `json:"pv"`
	Volume           json.RawMessage `json:"volume"`
}

type response struct {
	Result      any    `json:"result,omitempty"`
	HasResult   bool   `json:"hasResult,omitempty"`
	Error       string `json:"error,omitempty"`
	Panic       bool   `json:"panic,omitempty"`
	DecodeError string `json:"decodeError,omitempty"`
}

type decodeError struct{ err error }

func (d decodeError) Error() string { return d.err.Error() }

// decode fills out from raw, refusing unknown fields; JSON null (or absent) leaves out nil.
func decode[T any](raw json.RawMessage) *T {
	if len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil
	}
	out := new(T)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		panic(decodeError{err})
	}
	return out
}

func run(req request) (result any, err error) {
	t := csitranslation.New()
	logger := logr.Discard()
	switch req.Op {
	case "pv_to_csi":
		return t.TranslateInTreePVToCSI(logger, decode[v1.PersistentVolume](req.Object))
	case "csi_to_pv":
		return t.TranslateCSIPVToInTree(decode[v1.PersistentVolume](req.Object))
	case "inline_to_csi":
		return t.TranslateInTreeInlineVolumeToCSI(logger, decode[v1.Volume](req.Object), req.PodNamespace)
	case "storageclass_to_csi":
		return t.TranslateInTreeStorageClassToCSI(logger, req.InTreePluginName, decode[storage.StorageClass](req.Object))
	case "is_pv_migratable":
		return t.IsPVMigratable(decode[v1.PersistentVolume](req.Object)), nil
	case "is_inline_migratable":
		return t.IsInlineMigratable(decode[v1.Volume](req.Object)), nil
	case "is_migratable_intree_plugin_by_name":
		return t.IsMigratableIntreePluginByName(req.Name), nil
	case "is_migrated_csi_driver_by_name":
		return t.IsMigratedCSIDriverByName(req.Name), nil
	case "get_intree_plugin_name_from_spec":
		return t.GetInTreePluginNameFromSpec(decode[v1.PersistentVolume](req.PV), decode[v1.Volume](req.Volume))
	case "get_csi_name_from_intree_name":
		return t.GetCSINameFromInTreeName(req.Name)
	case "get_intree_name_from_csi_name":
		return t.GetInTreeNameFromCSIName(req.Name)
	case "repair_handle":
		return t.RepairVolumeHandle(req.DriverName, req.VolumeHandle, req.NodeID)
	}
	return nil, fmt.Errorf("unknown op %q", req.Op)
}

func answer(line []byte) (resp response) {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return response{DecodeError: err.Error()}
	}
	defer func() {
		if r := recover(); r != nil {
			if d, ok := r.(decodeError); ok {
				resp = response{DecodeError: d.Error()}
				return
			}
			resp = response{Error: fmt.Sprint(r), Panic: true}
		}
	}()
	result, err := run(req)
	if err != nil {
		return response{Error: err.Error()}
	}
	return response{Result: result, HasResult: true}
}

func main() {
	in := bufio.NewReader(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for {
		line, err := in.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if encErr := enc.Encode(answer(line)); encErr != nil {
				fmt.Fprintln(os.Stderr, encErr)
				os.Exit(1)
			}
			if flushErr := out.Flush(); flushErr != nil {
				fmt.Fprintln(os.Stderr, flushErr)
				os.Exit(1)
			}
		}
		if err != nil {
			return
		}
	}
}
