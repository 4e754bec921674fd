//go:build !nvmlmock

package main

import (
	"github.com/ddp-agent/ddp-agent/nvml"
)

// openNVML opens the machine's NVML; nvmlmock builds swap in go-nvml's
// mock of a DGX A100 (nvml_mock.go).
func openNVML(func(string) string) (*nvml.Lib, []nvml.Option, error) {
	lib, err := nvml.Open()
	return lib, nil, err
}
