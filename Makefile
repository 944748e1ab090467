.PHONY: run test
run:
	bash scripts/run.sh
test:
	bash scripts/test.sh
