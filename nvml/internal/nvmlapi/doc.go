// Package nvmlapi is how nvml and its subpackages hold and call go-nvml:
// the library handle (Lib, exported as nvml.Lib), calls that turn a panic
// into an NVML error, and the probe for NVML functions the loaded driver
// may lack. It is internal so that go-nvml's types stay inside nvml/.
package nvmlapi
