package kube

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/orchard/orchard/runtime"
)

// Nodes lists the nodes sandbox pods may be placed on (those matching the
// node selector), for GET /resources: one API read per call, off the hot
// path. Listing nodes needs a cluster role (list nodes); without it the
// error says so and the server reports its own machine.
func (r *Runtime) Nodes(ctx context.Context) ([]runtime.Node, error) {
	sel := labels.SelectorFromSet(r.cfg.NodeSelector).String()
	list, err := r.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("kube runtime: list nodes: %w", err)
	}
	out := make([]runtime.Node, 0, len(list.Items))
	for _, n := range list.Items {
		if n.Spec.Unschedulable {
			continue
		}
		out = append(out, runtime.Node{Name: n.Name,
			CapacityCPU: n.Status.Capacity.Cpu().AsApproximateFloat64(), AllocatableCPU: n.Status.Allocatable.Cpu().AsApproximateFloat64(),
			CapacityMemory: n.Status.Capacity.Memory().Value(), AllocatableMemory: n.Status.Allocatable.Memory().Value()})
	}
	return out, nil
}
